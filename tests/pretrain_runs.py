"""Helpers for the pretraining tests: tiny runs of pretrain/run.py, in-process or as children."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from transformers.trainer import TRAINER_STATE_NAME

from common.run_contract import GPT_SUMMARY_FILE

REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_SCRIPT = REPO_ROOT / "pretrain" / "run.py"
TINY_CONFIG = REPO_ROOT / "pretrain" / "configs" / "tiny.yaml"
BLOCK_SIZE = 64


def shared_data_paths(corpus_dir: Path, tokenizer_dir: Path, tmp_path_factory) -> dict:
    """Test corpus, tokenizer, and one packed-block cache folder for the whole test session."""
    return {
        "corpus_dir": corpus_dir,
        "tokenizer_dir": tokenizer_dir,
        "cache_dir": tmp_path_factory.getbasetemp() / "pretrain_cache",
    }


def tiny_run_argv(
    corpus_dir: Path,
    tokenizer_dir: Path,
    cache_dir: Path,
    output_dir: Path,
    *,
    num_blocks: int = 96,
    **options: object,
) -> list[str]:
    """Command line of a tiny CPU run on the test corpus: `num_blocks` blocks of 64 tokens.

    With the default batch of 4 blocks that is 24 steps; `options` are further flags.
    """
    argv = [
        "--config", str(TINY_CONFIG),
        "--corpus", str(corpus_dir),
        "--tokenizer_dir", str(tokenizer_dir),
        "--cache_dir", str(cache_dir),
        "--output_dir", str(output_dir),
        "--block_size", str(BLOCK_SIZE),
        "--max_train_tokens", str(num_blocks * BLOCK_SIZE),
        "--per_device_train_batch_size", "4",
        "--logging_steps", "2",
        "--final_loss_window", "3",
        "--disable_tqdm", "true",
    ]  # fmt: skip
    for name, value in options.items():
        argv += [f"--{name}", str(value)]
    return argv


def subprocess_env() -> dict[str, str]:
    """Environment for child processes: offline, one thread each (the CI machine has 2 cores
    shared by everything; more threads than cores makes every step many times slower)."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }


def run_script_command(argv: list[str]) -> list[str]:
    return [sys.executable, str(RUN_SCRIPT), *argv]


def read_summary(output_dir: Path) -> dict:
    return json.loads((output_dir / GPT_SUMMARY_FILE).read_text())


def logged_losses(checkpoint_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of every training log entry in a checkpoint's trainer_state.json."""
    state = json.loads((checkpoint_dir / TRAINER_STATE_NAME).read_text())
    return [(entry["step"], entry["loss"]) for entry in state["log_history"] if "loss" in entry]
