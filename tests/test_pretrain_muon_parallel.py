"""The shipped recipe (Muon for the hidden matrices, AdamW for the rest) under every parallelism
on two CPU processes: DDP, FSDP2, ZeRO-2 and ZeRO-3 through accelerate, tensor and pipeline
parallelism through torchrun. Each ends within MUON_TOLERANCE of one process after NUM_STEPS
steps, with Newton-Schulz run on every hidden matrix; FSDP2 and ZeRO-2 killed (SIGKILL) after a
checkpoint resume to where their uninterrupted runs end."""

import contextlib
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from parallel_runs import launch_model_parallel, model_parallel_argv
from pretrain_runs import (
    BLOCK_SIZE,
    COURSE_OPTIMISER,
    read_summary,
    shared_data_paths,
    subprocess_env,
    tiny_run_argv,
)
from safetensors.torch import load_file
from sharded_runs import CONFIG_DIR, GLOBAL_BATCH, launch_two_processes, two_process_command

from common.run_contract import FINAL_MODEL_DIR, GPT_SUMMARY_FILE
from pretrain.checkpoints import CHECKPOINT_MANIFEST_FILE
from pretrain.run import main

pytestmark = pytest.mark.multiprocess

NUM_STEPS = 20
NUM_BLOCKS = NUM_STEPS * GLOBAL_BATCH
SAVE_STEPS = 5
# Muon's Newton-Schulz runs in bf16: a sum taken in another order rounds apart (measured below).
MUON_TOLERANCE = 0.02
# The course's optimiser without clipping: DeepSpeed clips Muon's update, not the gradient
# (pretrain/optim.py refuses the pair), and every strategy is held to one reference.
MUON = {**COURSE_OPTIMISER, "muon": "true", "max_grad_norm": 0}
TRAINER_CONFIGS = {
    "ddp": "cpu_ddp.yaml",
    "fsdp2": "cpu_fsdp.yaml",
    "zero2": "cpu_deepspeed_zero2.yaml",
    "zero3": "cpu_deepspeed_zero3.yaml",
}
HIDDEN_MATRICES = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


@pytest.fixture
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


def trainer_options(**options: object) -> list[str]:
    """Flags of a NUM_STEPS-step Muon run saving at the step before the last (see
    `assert_newton_schulz_ran`) and the last."""
    options = {**MUON, "save_steps": NUM_STEPS - 1, "save_total_limit": 3, **options}
    return [part for name, value in options.items() for part in (f"--{name}", str(value))]


def one_process(data_paths: dict, tmp_path_factory, optimizer: str = "muon") -> Path:
    """pretrain/run.py in one process with the global batch (trained once per session)."""
    output_dir = tmp_path_factory.getbasetemp() / f"one_process_{optimizer}"
    if not (output_dir / GPT_SUMMARY_FILE).exists():
        argv = tiny_run_argv(**data_paths, output_dir=output_dir, num_blocks=NUM_BLOCKS)
        options = trainer_options(muon=optimizer == "muon")
        assert main([*argv, *options, "--per_device_train_batch_size", str(GLOBAL_BATCH)]) == 0
    return output_dir


def hidden_matrix_steps(run_dir: Path) -> dict[str, torch.Tensor]:
    """Each hidden matrix's last step: its final weights less those of the step before."""
    before = load_file(run_dir / f"checkpoint-{NUM_STEPS - 1}" / "model.safetensors")
    after = load_file(run_dir / FINAL_MODEL_DIR / "model.safetensors")
    return {
        name: after[name] - before[name]
        for name in after
        if name.endswith(tuple(f"{matrix}.weight" for matrix in HIDDEN_MATRICES))
    }


def is_orthogonalised(step: torch.Tensor) -> bool:
    """Newton-Schulz lifts a step's singular values toward one level (all but those of
    directions the gradient barely touched): the median is above 0.6 x the largest for Muon's
    steps here, below 0.11 x for AdamW's (Muon's decay is 0, the step is its update)."""
    singular_values = torch.linalg.svdvals(step.double())
    return bool(singular_values.median() > 0.4 * singular_values.max())


def assert_newton_schulz_ran(run_dir: Path) -> None:
    steps = hidden_matrix_steps(run_dir)
    assert len(steps) == 2 * len(HIDDEN_MATRICES)  # 2 layers
    flat = {name: is_orthogonalised(step) for name, step in steps.items()}
    assert all(flat.values()), flat


def test_the_orthogonality_check_tells_muon_from_adamw(data_paths, tmp_path_factory):
    """The check the strategies are held to fails where Newton-Schulz did not run."""
    assert_newton_schulz_ran(one_process(data_paths, tmp_path_factory))
    adamw_steps = hidden_matrix_steps(one_process(data_paths, tmp_path_factory, "adamw"))
    assert not any(is_orthogonalised(step) for step in adamw_steps.values())


def two_processes(strategy: str, data_paths: dict, tmp_path_factory) -> Path:
    """The run of `strategy` on two processes (trained once per session)."""
    run_dir = tmp_path_factory.getbasetemp() / f"two_processes_{strategy}"
    if not (run_dir / GPT_SUMMARY_FILE).exists():
        config = CONFIG_DIR / TRAINER_CONFIGS[strategy]
        options = trainer_options()
        result = launch_two_processes(config, data_paths, run_dir, *options, num_blocks=NUM_BLOCKS)
        assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.parametrize("strategy", list(TRAINER_CONFIGS))
def test_muon_under_trainer_strategies_trains_like_one_process(
    strategy, data_paths, tmp_path_factory
):
    reference_dir = one_process(data_paths, tmp_path_factory)
    run_dir = two_processes(strategy, data_paths, tmp_path_factory)
    run, reference = read_summary(run_dir), read_summary(reference_dir)
    assert run["parallelism"]["strategy"] == strategy
    assert run["global_step"] == reference["global_step"] == NUM_STEPS
    assert run["final_loss"] == pytest.approx(reference["final_loss"], abs=MUON_TOLERANCE)
    assert run["eval_loss"] == pytest.approx(reference["eval_loss"], abs=MUON_TOLERANCE)
    gap = run["eval_loss"] - reference["eval_loss"]
    print(f"{strategy}: eval loss {gap:+.6f} from one process's")
    assert_newton_schulz_ran(run_dir)
    if strategy == "fsdp2":  # Muon's momentum is gathered for a step only: kept as shards
        (whole,) = read_summary(reference_dir)["parallelism"]["ranks"]
        for rank in run["parallelism"]["ranks"]:
            share = rank["optimizer_state_bytes"] / whole["optimizer_state_bytes"]
            assert share == pytest.approx(0.5, rel=0.01)


@pytest.mark.parametrize("strategy", ["fsdp2", "zero2"])
def test_a_sharded_muon_run_killed_after_a_checkpoint_resumes_to_the_same_loss(
    strategy, data_paths, tmp_path_factory, tmp_path
):
    """Each process's share of Muon's momentum and AdamW's moments is in the checkpoint."""
    uninterrupted = two_processes(strategy, data_paths, tmp_path_factory)
    run_dir = tmp_path / strategy
    config = CONFIG_DIR / TRAINER_CONFIGS[strategy]
    options = trainer_options(save_steps=SAVE_STEPS, save_total_limit=NUM_STEPS)
    command = two_process_command(config, data_paths, run_dir, *options, num_blocks=NUM_BLOCKS)
    launcher = subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.DEVNULL)
    try:
        first = run_dir / f"checkpoint-{SAVE_STEPS}" / CHECKPOINT_MANIFEST_FILE
        while not first.is_file():
            assert launcher.poll() is None, "the run ended before its first checkpoint"
            time.sleep(0.02)
    finally:  # the launcher and both processes (each leads its own group), no last save
        processes = [launcher, *psutil.Process(launcher.pid).children(recursive=True)]
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                process.kill()
        psutil.wait_procs([p for p in processes if p is not launcher], timeout=60)
        launcher.wait(timeout=60)
    assert not (run_dir / GPT_SUMMARY_FILE).exists()

    result = launch_two_processes(
        config, data_paths, run_dir, *options, "--resume_from_checkpoint", "auto",
        num_blocks=NUM_BLOCKS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    resumed, reference = read_summary(run_dir), read_summary(uninterrupted)
    assert SAVE_STEPS <= resumed["resumed_from_step"] < NUM_STEPS
    assert resumed["eval_loss"] == pytest.approx(reference["eval_loss"], abs=1e-5)
    assert resumed["final_loss"] == pytest.approx(reference["final_loss"], abs=1e-5)


@pytest.mark.parametrize("strategy", ["tp", "pp"])
def test_muon_under_tensor_and_pipeline_parallelism_trains_like_one_process(
    strategy, data_paths, tmp_path_factory, tmp_path
):
    """Tensor parallelism: torch's Muon on each split matrix whole (DTensor gathers what
    Newton-Schulz needs); pipeline parallelism: Muon on each stage's own matrices."""
    options = {**MUON, "max_train_tokens": NUM_BLOCKS * BLOCK_SIZE, "max_steps": NUM_STEPS}
    reference_dir = tmp_path_factory.getbasetemp() / "model_parallel_muon_reference"
    if not (reference_dir / GPT_SUMMARY_FILE).exists():
        assert main(model_parallel_argv(data_paths, reference_dir, **options)) == 0
    run_dir = tmp_path / strategy
    result = launch_model_parallel(
        ["--strategy", strategy, *model_parallel_argv(data_paths, run_dir, **options)]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run, reference = read_summary(run_dir), read_summary(reference_dir)
    assert run["global_step"] == reference["global_step"] == NUM_STEPS
    assert run["final_loss"] == pytest.approx(reference["final_loss"], abs=MUON_TOLERANCE)
    assert run["eval_loss"] == pytest.approx(reference["eval_loss"], abs=MUON_TOLERANCE)
    gap = run["eval_loss"] - reference["eval_loss"]
    print(f"{strategy}: eval loss {gap:+.6f} from one process's")
