"""A checkpoint of one process, DDP or FSDP2 on 2 processes resumed under another of them (and
FSDP2's by FSDP2 on 1 process): its weights, Muon's momentum, AdamW's moments and the schedule
carried over in a converted copy, ending where the uninterrupted run ends. ZeRO's are refused
(tests/test_pretrain_resume.py)."""

import shutil
import subprocess

import pytest
import torch
from pretrain_runs import (
    COURSE_OPTIMISER,
    read_summary,
    shared_data_paths,
    subprocess_env,
    tiny_run_argv,
)
from sharded_runs import (
    CONFIG_DIR,
    GLOBAL_BATCH,
    LOSS_TOLERANCE,
    NUM_BLOCKS,
    NUM_STEPS,
    two_process_command,
)
from transformers.trainer import OPTIMIZER_NAME, OPTIMIZER_NAME_BIN

from common.files import read_manifest
from common.run_contract import FINAL_MODEL_DIR, GPT_SUMMARY_FILE
from pretrain.checkpoints import checkpoint_damage
from pretrain.run import main

pytestmark = pytest.mark.multiprocess

SAVE_STEPS = NUM_STEPS // 2
# Muon and AdamW under a warmup-stable-decay schedule, a checkpoint halfway.
OPTIONS = [f"--{name}={value}" for name, value in COURSE_OPTIMISER.items()]
OPTIONS += ["--save_steps", str(SAVE_STEPS)]
# Each launch: its accelerate config (None: pretrain/run.py itself) and processes.
LAUNCHES = {
    "single": (None, 1),
    "ddp": (CONFIG_DIR / "cpu_ddp.yaml", 2),
    "fsdp2": (CONFIG_DIR / "cpu_fsdp.yaml", 2),
    "fsdp2 on 1": (CONFIG_DIR / "cpu_fsdp.yaml", 1),
}


def train(launch: str, data_paths: dict, output_dir, *options: str) -> None:
    """The tiny run of tests/sharded_runs.py (the same global batch) under `launch`, to its end."""
    config, processes = LAUNCHES[launch]
    if config is None:
        argv = tiny_run_argv(**data_paths, output_dir=output_dir, num_blocks=NUM_BLOCKS)
        assert (
            main([*argv, "--per_device_train_batch_size", str(GLOBAL_BATCH), *OPTIONS, *options])
            == 0
        )
        return
    command = two_process_command(config, data_paths, output_dir, *OPTIONS, *options)
    command[command.index("--num_processes") + 1] = str(processes)
    command += ["--per_device_train_batch_size", str(GLOBAL_BATCH // processes)]
    result = subprocess.run(
        command, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def finished_runs(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    """One uninterrupted run of each writing strategy: the tests resume copies of its folder
    from the checkpoint halfway, each under another strategy."""
    data_paths = shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)
    root = tmp_path_factory.mktemp("strategies")
    for launch in ("single", "ddp", "fsdp2"):
        train(launch, data_paths, root / launch)
    return data_paths, root


def optimizer_state_by_name(checkpoint) -> dict[str, dict[str, torch.Tensor]]:
    """Each parameter's optimizer state, named as the manifest names the optimizer's ones."""
    if (checkpoint / OPTIMIZER_NAME_BIN).is_file():  # FSDP2's full state dict: named
        return torch.load(checkpoint / OPTIMIZER_NAME_BIN, weights_only=True)["state"]
    names = read_manifest(checkpoint)["optimizer_parameters"]
    state = torch.load(checkpoint / OPTIMIZER_NAME, weights_only=True)["state"]
    return {names[index]: tensors for index, tensors in state.items()}


@pytest.mark.parametrize(
    ("written", "launched"),
    [
        ("single", "ddp"), ("ddp", "single"), ("single", "fsdp2"), ("fsdp2", "single"),
        ("ddp", "fsdp2"), ("fsdp2", "ddp"), ("fsdp2", "fsdp2 on 1"),
    ],
)  # fmt: skip
def test_a_checkpoint_resumes_under_another_strategy_to_the_uninterrupted_loss(
    finished_runs, tmp_path, written, launched
):
    data_paths, root = finished_runs
    output_dir = tmp_path / "run"
    shutil.copytree(root / written, output_dir)
    for name in (FINAL_MODEL_DIR, f"checkpoint-{NUM_STEPS}"):  # as if stopped after the first
        shutil.rmtree(output_dir / name)
    (output_dir / GPT_SUMMARY_FILE).unlink()

    train(launched, data_paths, output_dir, "--resume_from_checkpoint", "auto")
    resumed, uninterrupted = read_summary(output_dir), read_summary(root / written)
    assert resumed["resumed_from_step"] == SAVE_STEPS
    assert resumed["final_loss"] == pytest.approx(uninterrupted["final_loss"], abs=LOSS_TOLERANCE)
    assert resumed["eval_loss"] == pytest.approx(uninterrupted["eval_loss"], abs=LOSS_TOLERANCE)

    checkpoint = output_dir / f"checkpoint-{SAVE_STEPS}"
    assert checkpoint_damage(checkpoint) is None  # left as it was, every file as sealed
    (converted,) = output_dir.glob(f"converted-{checkpoint.name}-*")
    strategy, processes = launched.split()[0], LAUNCHES[launched][1]
    assert read_manifest(converted)["written_by"] == {
        "strategy": strategy,
        "num_processes": processes,
    }
    # The unchanged files are linked to the checkpoint's, not written again.
    assert (converted / "scheduler.pt").samefile(checkpoint / "scheduler.pt")
    state, carried = optimizer_state_by_name(checkpoint), optimizer_state_by_name(converted)
    assert sum("momentum_buffer" in tensors for tensors in state.values()) == 8  # 4 x 2 layers
    assert sum("exp_avg" in tensors for tensors in state.values()) == len(state) - 8
    assert carried.keys() == state.keys()
    for name, tensors in state.items():
        assert carried[name].keys() == tensors.keys()
        for key, tensor in tensors.items():
            assert torch.equal(carried[name][key], tensor), (name, key)
