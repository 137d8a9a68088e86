"""Tiny runs of pretrain/run.py on two CPU processes under a shipped accelerate config, and the
one-process run they must equal (made once per test session, shared by the FSDP and DeepSpeed
tests)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.utils.other import get_free_port
from pretrain_runs import (
    REPO_ROOT,
    RUN_SCRIPT,
    WritesAMarkerWhenUnpickled,
    logged_losses,
    read_summary,
    subprocess_env,
    tiny_run_argv,
)
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from common.run_contract import CHECKPOINT_MANIFEST_FILE, FINAL_MODEL_DIR, GPT_SUMMARY_FILE
from pretrain.checkpoints import (
    DEEPSPEED_TAG_FILE,
    PICKLED_SUFFIXES,
    checkpoint_damage,
    seal_checkpoint,
)
from pretrain.run import main

CONFIG_DIR = REPO_ROOT / "accelerate_configs"
NUM_BLOCKS = 32
GLOBAL_BATCH = 4  # blocks: 1 process x 4, or 2 processes x 2
NUM_STEPS = NUM_BLOCKS // GLOBAL_BATCH
# Sharded runs add the same numbers in another order: fp32 rounding, nothing more.
LOSS_TOLERANCE = 1e-4


def one_process_reference(data_paths: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of one process with the same global batch (trained on first use)."""
    output_dir = tmp_path_factory.getbasetemp() / "one_process_reference"
    if not (output_dir / GPT_SUMMARY_FILE).exists():
        argv = tiny_run_argv(**data_paths, output_dir=output_dir, num_blocks=NUM_BLOCKS)
        assert main([*argv, "--per_device_train_batch_size", str(GLOBAL_BATCH)]) == 0
    return output_dir


def two_process_command(
    config: Path, data_paths: dict, output_dir: Path, *options: str, num_blocks: int = NUM_BLOCKS
) -> list[str]:
    """`accelerate launch --config_file config` of the tiny run, 2 processes x 2 blocks."""
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(config),
        "--num_processes", "2", "--num_cpu_threads_per_process", "1",
        "--main_process_port", str(get_free_port()),
        str(RUN_SCRIPT),
        *tiny_run_argv(**data_paths, output_dir=output_dir, num_blocks=num_blocks),
        "--per_device_train_batch_size", str(GLOBAL_BATCH // 2),
        *options,
    ]  # fmt: skip


def launch_two_processes(
    config: Path, data_paths: dict, output_dir: Path, *options: str, num_blocks: int = NUM_BLOCKS
) -> subprocess.CompletedProcess:
    """Run `two_process_command` to its end."""
    command = two_process_command(config, data_paths, output_dir, *options, num_blocks=num_blocks)
    return subprocess.run(
        command, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )


def assert_trains_like_one_process(run_dir: Path, reference_dir: Path) -> None:
    """Same steps, same losses, same final weights; final/ loads with its tied embedding."""
    run, reference = read_summary(run_dir), read_summary(reference_dir)
    assert run["max_steps"] == reference["max_steps"] == NUM_STEPS
    assert run["global_batch_tokens"] == reference["global_batch_tokens"]
    run_losses = logged_losses(run_dir / f"checkpoint-{NUM_STEPS}")
    reference_losses = logged_losses(reference_dir / f"checkpoint-{NUM_STEPS}")
    assert [step for step, _ in run_losses] == [step for step, _ in reference_losses]
    assert [loss for _, loss in run_losses] == pytest.approx(
        [loss for _, loss in reference_losses], abs=LOSS_TOLERANCE
    )
    assert run["final_loss"] == pytest.approx(reference["final_loss"], abs=LOSS_TOLERANCE)
    assert run["eval_loss"] == pytest.approx(reference["eval_loss"], abs=LOSS_TOLERANCE)

    model = AutoModelForCausalLM.from_pretrained(run_dir / FINAL_MODEL_DIR)
    assert model.lm_head.weight is model.transformer.wte.weight
    reference_weights = load_file(reference_dir / FINAL_MODEL_DIR / "model.safetensors")
    weights = model.state_dict()
    for name, weight in reference_weights.items():
        torch.testing.assert_close(weights[name], weight, atol=1e-5, rtol=1e-4)


def rank_records(run_dir: Path) -> list[dict]:
    return read_summary(run_dir)["parallelism"]["ranks"]


def assert_only_tensors_load(run_dir: Path, strategy: str, tmp_path: Path) -> None:
    """The run's last checkpoint is whole and records the `strategy` on 2 processes that wrote
    it; a pickle planted in any of its pickled files (DeepSpeed's shards one folder down
    included), the manifest rewritten to match, is damage found before anything unpickles it,
    and so is DeepSpeed's `latest` naming a folder outside it."""
    checkpoint = run_dir / f"checkpoint-{NUM_STEPS}"
    assert checkpoint_damage(checkpoint) is None
    record = json.loads((checkpoint / CHECKPOINT_MANIFEST_FILE).read_text())
    assert record["written_by"] == {"strategy": strategy, "num_processes": 2}
    del record["files"]
    marker = tmp_path / "marker"
    pickled = [p for p in checkpoint.rglob("*") if p.suffix in PICKLED_SUFFIXES]
    assert len(pickled) >= 4
    for path in pickled:
        name = path.relative_to(checkpoint).as_posix()
        planted = tmp_path / "planted" / checkpoint.name
        shutil.copytree(checkpoint, planted)
        torch.save(WritesAMarkerWhenUnpickled(marker), planted / name)
        seal_checkpoint(planted, record)
        damage = checkpoint_damage(planted)
        if path.name == "training_args.bin":  # Trainer never loads it
            assert damage is None
        else:
            assert damage.startswith(f"{name} does not load as tensors only"), damage
        shutil.rmtree(planted.parent)
    assert not marker.exists()
    if (checkpoint / DEEPSPEED_TAG_FILE).exists():
        shutil.copytree(checkpoint, planted)
        (planted / DEEPSPEED_TAG_FILE).write_text("../global_step8")
        seal_checkpoint(planted, record)
        assert checkpoint_damage(planted) == (
            f"{DEEPSPEED_TAG_FILE} names '../global_step8', not a folder of {checkpoint.name}/"
        )
