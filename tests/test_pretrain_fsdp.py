"""FSDP2 through `accelerate launch pretrain/run.py` on two CPU processes (the shipped
cpu_fsdp.yaml): really FSDP, each process holds half of the weights and of the Adam state, and it
trains like one process with the same global batch. FSDP1 is refused on CPU processes."""

import re

import pytest
from pretrain_runs import read_summary, shared_data_paths
from sharded_runs import (
    CONFIG_DIR,
    assert_only_tensors_load,
    assert_trains_like_one_process,
    launch_two_processes,
    one_process_reference,
    rank_records,
)

pytestmark = pytest.mark.multiprocess

FSDP_CONFIG = CONFIG_DIR / "cpu_fsdp.yaml"


@pytest.fixture
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


def test_fsdp2_on_two_cpu_processes_shards_and_trains_like_one_process(
    data_paths, tmp_path_factory, tmp_path
):
    reference_dir = one_process_reference(data_paths, tmp_path_factory)
    run_dir = tmp_path / "fsdp"
    result = launch_two_processes(FSDP_CONFIG, data_paths, run_dir)
    assert result.returncode == 0, result.stderr[-3000:]

    parallelism = read_summary(run_dir)["parallelism"]
    assert parallelism["strategy"] == "fsdp2"
    assert parallelism["distributed_type"] == "FSDP"
    assert parallelism["num_processes"] == 2
    (whole,) = rank_records(reference_dir)
    ranks = rank_records(run_dir)
    assert [record["rank"] for record in ranks] == [0, 1]
    for record in ranks:  # half of every weight and half of its Adam moments
        assert record["parameter_bytes"] == pytest.approx(whole["parameter_bytes"] / 2, rel=0.01)
        assert record["optimizer_state_bytes"] == pytest.approx(
            whole["optimizer_state_bytes"] / 2, rel=0.01
        )
    assert sum(record["parameter_bytes"] for record in ranks) == whole["parameter_bytes"]
    assert_trains_like_one_process(run_dir, reference_dir)
    assert_only_tensors_load(run_dir, "fsdp2", tmp_path)


def test_fsdp1_on_cpu_processes_is_refused_in_one_line(data_paths, tmp_path):
    config = tmp_path / "cpu_fsdp1.yaml"
    config.write_text(FSDP_CONFIG.read_text().replace("fsdp_version: 2", "fsdp_version: 1"))
    result = launch_two_processes(config, data_paths, tmp_path / "run")

    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and errors[0] == errors[1]  # one line from each process
    assert "FSDP1" in errors[0] and "fsdp_version: 2" in errors[0]
    assert re.search(r"exitcode\s*:\s*2\b", result.stderr)  # each process exited with 2
    assert not (tmp_path / "run").exists()
