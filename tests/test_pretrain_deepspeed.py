"""DeepSpeed ZeRO-2 and ZeRO-3 through `accelerate launch pretrain/run.py` on two CPU processes
(the shipped cpu_deepspeed_zero*.yaml): really DeepSpeed, sharding what each stage shards, and
training like one process with the same global batch."""

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

# Per process, as shares of one process's bytes (parameters, optimizer state): ZeRO-2 keeps
# every weight, half of the Adam moments and an fp32 copy of its half of the weights (the
# partition its optimizer updates); ZeRO-3 keeps half of the weights, updated in place, and
# half of the moments.
SHARES = {2: (1.0, 0.75), 3: (0.5, 0.5)}


@pytest.fixture
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_zero_on_two_cpu_processes_shards_and_trains_like_one_process(
    zero_stage, data_paths, tmp_path_factory, tmp_path
):
    reference_dir = one_process_reference(data_paths, tmp_path_factory)
    run_dir = tmp_path / f"zero{zero_stage}"
    config = CONFIG_DIR / f"cpu_deepspeed_zero{zero_stage}.yaml"
    result = launch_two_processes(config, data_paths, run_dir)
    assert result.returncode == 0, result.stderr[-3000:]

    parallelism = read_summary(run_dir)["parallelism"]
    assert parallelism["strategy"] == f"zero{zero_stage}"
    assert parallelism["distributed_type"] == "DEEPSPEED"
    assert parallelism["num_processes"] == 2
    (whole,) = rank_records(reference_dir)
    parameter_share, optimizer_share = SHARES[zero_stage]
    for record in rank_records(run_dir):
        assert record["parameter_bytes"] == pytest.approx(
            parameter_share * whole["parameter_bytes"], rel=0.01
        )
        assert record["optimizer_state_bytes"] == pytest.approx(
            optimizer_share * whole["optimizer_state_bytes"], rel=0.01
        )
    assert_trains_like_one_process(run_dir, reference_dir)
    assert_only_tensors_load(run_dir, f"zero{zero_stage}", tmp_path)
