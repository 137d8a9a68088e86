"""Two CPU processes (gloo DDP), started by the README's command, train like one process with the
same global batch, and really in sync."""

import re
import subprocess
import sys

import pytest
import torch
from pretrain_runs import (
    REPO_ROOT,
    RUN_SCRIPT,
    logged_losses,
    read_summary,
    shared_data_paths,
    subprocess_env,
    tiny_run_argv,
)
from safetensors.torch import load_file

from pretrain.run import main

pytestmark = pytest.mark.multiprocess

NUM_BLOCKS = 64
GLOBAL_BATCH = 4  # blocks: 1 process x 4, or 2 processes x 2
NUM_STEPS = NUM_BLOCKS // GLOBAL_BATCH
CPU_DDP_CONFIG = REPO_ROOT / "accelerate_configs" / "cpu_ddp.yaml"


@pytest.fixture
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


@pytest.mark.parametrize("optimizer", [{}, {"muon": "true"}], ids=["adamw", "muon"])
def test_two_process_ddp_matches_one_process_with_the_same_global_batch(
    optimizer, data_paths, tmp_path
):
    single_dir, ddp_dir = tmp_path / "single", tmp_path / "ddp"
    # 17 validation blocks: on two processes the last evaluation batch is padded with a repeat.
    split = {"validation_fraction": 0.03, **optimizer}
    argv = tiny_run_argv(**data_paths, output_dir=single_dir, num_blocks=NUM_BLOCKS, **split)
    assert main(argv) == 0

    # The README's command: the config picks the launcher that starts several processes, use_cpu
    # in tiny.yaml keeps them on gloo. Otherwise accelerate would start one process, or two
    # unsynchronised copies, and still exit 0.
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(CPU_DDP_CONFIG), "--num_processes", "2",
        str(RUN_SCRIPT),
        *tiny_run_argv(**data_paths, output_dir=ddp_dir, num_blocks=NUM_BLOCKS, **split),
        "--per_device_train_batch_size", str(GLOBAL_BATCH // 2),
    ]  # fmt: skip
    result = subprocess.run(
        command, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]

    single, ddp = read_summary(single_dir), read_summary(ddp_dir)
    assert ddp["num_processes"] == 2 and "Num processes: 2" in ddp["accelerator_state"]
    assert "MULTI_CPU" in ddp["accelerator_state"]
    # Synchronised: both ranks end with bit-identical parameters.
    assert len(ddp["replica_checksums"]) == 2 and ddp["replicas_in_sync"] is True
    # Same global batch, same blocks per step: the same number of steps and the same curve.
    assert ddp["global_batch_tokens"] == single["global_batch_tokens"]
    assert ddp["max_steps"] == single["max_steps"] == NUM_STEPS
    single_losses = logged_losses(single_dir / f"checkpoint-{NUM_STEPS}")
    ddp_losses = logged_losses(ddp_dir / f"checkpoint-{NUM_STEPS}")
    assert [step for step, _ in ddp_losses] == [step for step, _ in single_losses]
    # One progress line per logging step, rank 0's alone.
    progress = re.findall(rf"pretrain\.metrics: step (\d+)/{NUM_STEPS}: ", result.stderr)
    assert [int(step) for step in progress] == [step for step, _ in ddp_losses]
    assert [loss for _, loss in ddp_losses] == pytest.approx(
        [loss for _, loss in single_losses], abs=1e-4
    )
    assert single["data"]["splits"]["validation"]["num_blocks"] == 17
    assert ddp["eval_loss"] == pytest.approx(single["eval_loss"], abs=1e-4)
    assert ddp["config"]["MuonArguments"]["muon"] is bool(optimizer)
    single_weights = load_file(single_dir / "final" / "model.safetensors")
    ddp_weights = load_file(ddp_dir / "final" / "model.safetensors")
    for name, weight in single_weights.items():
        if optimizer:
            # Muon orthogonalises in bf16, where sums added in another order round apart: one
            # process accumulating two halves of each batch ends as far away (up to 2.6%).
            assert (ddp_weights[name] - weight).norm() <= 0.05 * weight.norm(), name
        else:
            torch.testing.assert_close(ddp_weights[name], weight, atol=2e-4, rtol=1e-3)


def test_processes_that_do_not_join_one_training_are_refused(data_paths, tmp_path):
    # The trap the test above avoids: the accelerate config's use_cpu does not reach the processes,
    # so without use_cpu in the training arguments two CPU processes would each train alone.
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(CPU_DDP_CONFIG), "--num_processes", "2",
        str(RUN_SCRIPT),
        *tiny_run_argv(**data_paths, output_dir=tmp_path / "run", num_blocks=NUM_BLOCKS),
        "--use_cpu", "false",
    ]  # fmt: skip
    result = subprocess.run(
        command, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode != 0
    assert "did not join one training" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()
