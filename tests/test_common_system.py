"""The node a run finds: torch's threads and its extensions folder."""

import os
import subprocess
import sys

import pytest
from pretrain_runs import subprocess_env

from common.system import build_extensions_in_this_environment, threads_for_load

AFFINITY = len(os.sched_getaffinity(0))
PRINT_THREADS = (
    "import torch\nfrom common.cli import entry_point\n"
    "entry_point(lambda argv: print(torch.get_num_threads(), flush=True))([])"
)


def entry_point_threads(**variables: str) -> tuple[int, str]:
    """Torch's threads in a new entry point's process with `variables` set, and its stderr."""
    unset = ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK", "LOCAL_WORLD_SIZE")
    env = {key: value for key, value in subprocess_env().items() if key not in unset}
    finished = subprocess.run(
        [sys.executable, "-c", PRINT_THREADS],
        env={**env, **variables},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(finished.stdout), finished.stderr


def test_slurm_s_allocation_and_omp_num_threads_are_bounded_by_the_affinity_mask():
    # A count past the cores (it segfaulted torch when copied as asked) takes the mask's.
    assert entry_point_threads(SLURM_CPUS_PER_TASK="100000")[0] == AFFINITY
    assert entry_point_threads(OMP_NUM_THREADS="100000")[0] == AFFINITY
    assert entry_point_threads(SLURM_CPUS_PER_TASK="100000", OMP_NUM_THREADS="1")[0] == 1


@pytest.mark.skipif(AFFINITY < 2, reason="one core: no fewer threads to choose")
def test_fewer_threads_than_the_mask_are_said_in_one_line_unless_asked_for():
    threads, stderr = entry_point_threads(SLURM_CPUS_PER_TASK="1")
    assert threads == 1
    assert (
        f"using 1 of {AFFINITY} cores (SLURM_CPUS_PER_TASK=1); set OMP_NUM_THREADS to choose"
        in stderr
    )
    threads, stderr = entry_point_threads(OMP_NUM_THREADS="1")
    assert threads == 1 and "set OMP_NUM_THREADS" not in stderr
    # Two processes of a launch on this node share what Slurm gave.
    threads, stderr = entry_point_threads(
        SLURM_CPUS_PER_TASK=str(AFFINITY), LOCAL_WORLD_SIZE=str(AFFINITY)
    )
    assert threads == 1
    assert f"(SLURM_CPUS_PER_TASK={AFFINITY}, {AFFINITY} processes on this node)" in stderr


def test_the_load_leaves_its_free_cores_shared_by_the_node_s_processes_at_least_one():
    assert threads_for_load(2, 7.9, 1) == 1  # busier than the cores: one
    assert threads_for_load(2, 0.9, 1) == 2  # less than a core busy
    assert threads_for_load(2, 1.2, 1) == 1
    assert threads_for_load(16, 3.5, 1) == 13
    assert threads_for_load(16, 4.0, 2) == 6
    assert threads_for_load(8, 0.0, 3) == 2
    assert threads_for_load(4, 0.0, 8) == 1  # more processes than cores


def test_extensions_are_built_in_this_environment_unless_a_folder_is_chosen(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    build_extensions_in_this_environment()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "chosen"))
    build_extensions_in_this_environment()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "chosen")
