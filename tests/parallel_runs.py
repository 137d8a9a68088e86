"""Helpers for the tensor- and pipeline-parallel tests: tiny runs of
pretrain/run_model_parallel.py under launch-pretraining, and the one-process reference they
must equal: pretrain/run.py itself."""

import subprocess
import sys
from pathlib import Path

from pretrain_runs import BLOCK_SIZE, REPO_ROOT, TINY_CONFIG, subprocess_env
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.run_contract import GPT_SUMMARY_FILE, TENSORBOARD_DIR
from pretrain.run import main as pretrain_main

BATCH_BLOCKS = 4
NUM_STEPS = 8
# The token budget of tests/test_pretrain_ddp.py, so that both read one cache of packed blocks.
NUM_BLOCKS = 64
NUM_PROCESSES = 2


def model_parallel_argv(data_paths: dict, output_dir: Path, **options: object) -> list[str]:
    """A tiny run on the test corpus: the first NUM_STEPS steps of BATCH_BLOCKS blocks of 64
    tokens (the learning-rate schedule spans those steps), every step logged."""
    argv = [
        "--config", str(TINY_CONFIG),
        "--corpus", str(data_paths["corpus_dir"]),
        "--tokenizer_dir", str(data_paths["tokenizer_dir"]),
        "--cache_dir", str(data_paths["cache_dir"]),
        "--block_size", str(BLOCK_SIZE),
        "--max_train_tokens", str(NUM_BLOCKS * BLOCK_SIZE),
        "--max_steps", str(NUM_STEPS),
        "--per_device_train_batch_size", str(BATCH_BLOCKS),
        "--logging_steps", "1",
        "--save_strategy", "no",
        "--disable_tqdm", "true",
        "--output_dir", str(output_dir),
    ]  # fmt: skip
    for name, value in options.items():
        argv += [f"--{name}", str(value)]
    return argv


def logged_scalars(run_dir: Path, tag: str) -> list[float]:
    """A TensorBoard scalar of a run folder, in step order."""
    accumulator = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    accumulator.Reload()
    return [event.value for event in sorted(accumulator.Scalars(tag), key=lambda e: e.step)]


def trainer_reference(data_paths: dict, tmp_path_factory) -> Path:
    """pretrain/run.py in one process on the same steps: the run folder every strategy is held
    to, trained once per test session and shared by every module."""
    output_dir = tmp_path_factory.getbasetemp() / "parallel_reference"
    if not (output_dir / GPT_SUMMARY_FILE).is_file():
        assert pretrain_main(model_parallel_argv(data_paths, output_dir)) == 0
    return output_dir


def launch_model_parallel(argv: list[str]) -> subprocess.CompletedProcess:
    """`launch-pretraining` (the documented command) on 2 CPU processes:
    pretrain/run_model_parallel.py ARGV."""
    command = [
        sys.executable, "-m", "pretrain.launch",
        "--config_file", str(REPO_ROOT / "accelerate_configs" / "cpu_ddp.yaml"),
        "--num_processes", str(NUM_PROCESSES),
        str(REPO_ROOT / "pretrain" / "run_model_parallel.py"), *argv,
    ]  # fmt: skip
    return subprocess.run(
        command, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )
