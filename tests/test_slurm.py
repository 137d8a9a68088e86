"""The shipped sbatch scripts, submitted for real to a throw-away Slurm cluster on this machine.

The cluster (scripts/slurm/local_cluster.sh) has two emulated nodes with one fake GPU each and
the course cluster's partitions: debug (5 min) and normal (20 min). Where Slurm is not
installed, every test here is skipped with the reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from slurm_cluster import (
    REPO_ROOT,
    LocalCluster,
    is_running,
    local_cluster,
    missing_requirements,
)

SLURM_SCRIPTS = REPO_ROOT / "scripts" / "slurm"

pytestmark = pytest.mark.skipif(
    missing_requirements() is not None, reason=str(missing_requirements())
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with local_cluster(tmp_path_factory.mktemp("slurm")) as running_cluster:
        yield running_cluster


def wait_until(condition: Callable[[], object], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what} after {timeout} s"
        time.sleep(0.2)


def submit_and_wait(
    cluster: LocalCluster,
    script: Path,
    log: Path,
    *script_args: str,
    sbatch_options: tuple[str, ...] = (),
    timeout: float = 240,
    **env_overrides: str,
) -> str:
    """Submit SCRIPT with `sbatch --wait`, assert the job succeeded and return its log."""
    submitted = cluster.run(
        ["sbatch", "--wait", f"--output={log}", *sbatch_options, str(script), *script_args],
        timeout=timeout,
        **env_overrides,
    )
    job_log = log.read_text() if log.exists() else "(no job log)"
    assert submitted.returncode == 0, (
        f"sbatch --wait {script.name} exited {submitted.returncode}\n"
        f"sbatch stderr: {submitted.stderr}\njob log:\n{job_log}"
    )
    return job_log


def test_two_node_step_sees_ranks_and_head_node(cluster: LocalCluster) -> None:
    # What the multi-node scripts rely on: one task per node, the rank in SLURM_PROCID and the
    # head node as the first of `scontrol show hostnames`.
    step = cluster.run(
        [
            "srun",
            "--nodes=2",
            "--ntasks-per-node=1",
            "bash",
            "-c",
            "echo $SLURM_PROCID $SLURMD_NODENAME"
            ' "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        ]
    )
    assert step.returncode == 0, step.stderr
    ranks = sorted(line.split() for line in step.stdout.splitlines())
    assert ranks == [["0", "127.0.0.2", "127.0.0.2"], ["1", "127.0.0.3", "127.0.0.2"]]


@pytest.mark.parametrize(("partition", "minutes"), [("debug", 6), ("normal", 21)])
def test_job_over_partition_time_limit_is_refused_at_submission(
    cluster: LocalCluster, tmp_path: Path, partition: str, minutes: int
) -> None:
    submitted = cluster.run(
        [
            "sbatch",
            f"--partition={partition}",
            f"--time={minutes}",
            f"--output={tmp_path / 'never.out'}",
            str(SLURM_SCRIPTS / "mnist.sbatch"),
        ]
    )
    assert submitted.returncode != 0
    assert "Requested time limit is invalid" in submitted.stderr
    assert cluster.jobs() == []


def test_down_cancels_jobs_and_stops_every_daemon(tmp_path: Path) -> None:
    # A cluster of its own: this one is taken down while a job still runs.
    with local_cluster(tmp_path / "cluster") as own_cluster:
        pid_file = tmp_path / "job.pid"
        submitted = own_cluster.run(
            ["sbatch", "--parsable", f"--output={tmp_path / 'job.out'}", "--wrap",
             f"echo $$ > {pid_file}; exec sleep 300"]
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the job to start")
        job_pid = int(pid_file.read_text())
        daemon_pids = own_cluster.daemon_pids()
        assert len(daemon_pids) == 4  # munged, slurmctld, two slurmd
        assert all(is_running(pid) for pid in [job_pid, *daemon_pids])
    assert not any(is_running(pid) for pid in [job_pid, *daemon_pids])
    assert not list((tmp_path / "cluster" / "run").glob("*.pid"))


def test_mnist_lenet5_on_debug_partition_writes_test_accuracy(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    run_dir = tmp_path / "mnist"
    job_log = submit_and_wait(
        cluster,
        SLURM_SCRIPTS / "mnist.sbatch",
        tmp_path / "mnist.out",
        # A short run on the embedded 5k digits: enough to beat chance clearly.
        *("--epochs", "1", "--max_steps", "30", "--on_device_data", "true"),
        *("--num_projector_digits", "16"),
        OUTPUT_DIR=str(run_dir),
        OMP_NUM_THREADS="1",  # all emulated nodes share this machine's cores
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["num_test"] == 1000
    assert metrics["test_accuracy"] > 0.3, metrics["test_accuracy"]  # chance is 0.1
    # The job got the partition's (fake) GPU, which CUDA cannot use: the CPU fallback.
    assert "partition debug, GPUs: 0" in job_log
    assert metrics["device"] == "cpu"
