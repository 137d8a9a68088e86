"""Helpers for the pretraining tests: tiny runs of pretrain/run.py, in-process or as children."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers.trainer import TRAINER_STATE_NAME

from common.run_contract import GPT_SUMMARY_FILE

REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_SCRIPT = REPO_ROOT / "pretrain" / "run.py"
TINY_CONFIG = REPO_ROOT / "pretrain" / "configs" / "tiny.yaml"
BLOCK_SIZE = 64
COURSE_CONFIG = yaml.safe_load(TINY_CONFIG.with_name("gpt2_117m.yaml").read_text())
# The course config's optimiser: Muon and AdamW, and a warmdown given as a share of the steps.
COURSE_OPTIMISER = {
    name: json.dumps(value) if isinstance(value, dict) else value
    for name, value in COURSE_CONFIG.items()
    if name.startswith(("muon", "embedding_", "adam_", "lr_scheduler", "warmup"))
}


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


@contextlib.contextmanager
def small_disk(mount_point: Path, size: str, read_only_after=None):
    """A real tmpfs of `size` at `mount_point` (mounting needs root; CI runs as root); with
    `read_only_after`, that is called on it, then it is remounted read-only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True, text=True,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        if read_only_after is not None:
            read_only_after(mount_point)
            subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


class WritesAMarkerWhenUnpickled:
    """A pickle that runs code: unpickling it writes the file it names."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))
