"""The run folder's guarantees: one run per folder, a final model written whole, saves that fail
in one line.

- A run holds its folder's lock (`hold_run_folder`) for its lifetime; a second run into the same
  folder is refused, naming the holder. The kernel drops the lock of a killed process.
- `final/` appears only when complete (written under a temporary name, then renamed).
- A save that fails (a checkpoint, the final model, the summary) is one line naming the folder
  and the cause (a full disk with its free space), the unfinished checkpoint removed.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from transformers import Trainer, TrainingArguments

from common.cli import InputError, RunFailed
from common.files import LOCK_FILE, LockHeld, exclusive_lock
from pretrain.checkpoints import RESUME_AUTO, list_checkpoints, read_manifest
from pretrain.parallel.strategy import from_rank

logger = logging.getLogger(__name__)

# The functions whose failure is a failed save (as opposed to a bug in training).
SAVING_FUNCTIONS = frozenset(
    {"_save_checkpoint", "save_model", "save_final_model", "write_json_atomic", "on_save"}
)


@contextmanager
def hold_run_folder(output_dir: Path, training_args: TrainingArguments) -> Iterator[None]:
    """One run per folder: the main process holds the folder's lock while the block runs, and
    every process stops with one line naming the holder when another run has it.

    A folder created here is removed again when the block fails before writing anything but
    the lock (bad input found late), so a refused run leaves nothing behind.
    """
    is_main = training_args.process_index == 0
    created = is_main and not output_dir.exists()
    with ExitStack() as stack:
        refusal = None
        if is_main:
            try:
                output_dir.mkdir(parents=True, exist_ok=True)
                stack.enter_context(exclusive_lock(output_dir / LOCK_FILE, wait=False))
            except LockHeld as held:
                refusal = (
                    f"output folder {output_dir} is in use by another run ({held.holder}); "
                    "wait for it to end, or pass another --output_dir"
                )
            except OSError as err:
                refusal = f"cannot write to output folder {output_dir}: {err.strerror}"
        refusal = from_rank(0, refusal)
        if refusal is not None:
            raise InputError(refusal)
        try:
            yield
        except BaseException:
            if created and {path.name for path in output_dir.iterdir()} <= {LOCK_FILE}:
                shutil.rmtree(output_dir, ignore_errors=True)
            raise


@contextmanager
def failed_saves_in_one_line(
    output_dir: Path, checkpoint_bytes: int, is_main: bool
) -> Iterator[None]:
    """Turn a save that fails (a checkpoint, the final model, the summary) into `RunFailed`:
    one line naming the folder and the cause, the unfinished checkpoint removed. Other
    exceptions pass through unchanged.

    `checkpoint_bytes` is about what a checkpoint takes: a failure while the disk has less than
    that free is a full disk, whatever the writer's own message says (torch's zip writer says
    "unexpected pos", safetensors an I/O error).
    """
    try:
        yield
    except Exception as err:
        if not _raised_while_saving(err):
            raise
        cause = _save_failure_cause(err, output_dir, checkpoint_bytes)
        removed = []
        if is_main:
            removed = [
                path.name for path in list_checkpoints(output_dir) if not read_manifest(path)
            ]
            for name in removed:
                shutil.rmtree(output_dir / name, ignore_errors=True)
        kept = f"; removed the unfinished {', '.join(removed)}" if removed else ""
        raise RunFailed(
            f"cannot save in {output_dir}: {cause}{kept}; free space (or pass another "
            f"--output_dir) and continue with --resume_from_checkpoint {RESUME_AUTO}"
        ) from err


def _raised_while_saving(err: BaseException) -> bool:
    names = {frame.name for frame in traceback.extract_tb(err.__traceback__)}
    return bool(names & SAVING_FUNCTIONS)


def _save_failure_cause(err: BaseException, output_dir: Path, checkpoint_bytes: int) -> str:
    chain, seen = [], err
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for exception in chain:
        if isinstance(exception, OSError) and exception.errno:
            return os.strerror(exception.errno).lower() + (
                f" ({exception.filename})" if exception.filename else ""
            )
    free = shutil.disk_usage(output_dir).free
    if free < checkpoint_bytes:
        return (
            f"{os.strerror(errno.ENOSPC).lower()} ({free / 2**20:,.1f} MiB free, a checkpoint "
            f"takes about {checkpoint_bytes / 2**20:,.1f} MiB)"
        )
    return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"


def save_final_model(trainer: Trainer, final_dir: Path) -> None:
    """Model (safetensors) + tokenizer into `final_dir`, which appears only when complete."""
    staging_dir = final_dir.with_name(f".{final_dir.name}.tmp")
    if trainer.is_world_process_zero() and staging_dir.exists():
        shutil.rmtree(staging_dir)
    trainer.accelerator.wait_for_everyone()
    try:
        trainer.save_model(str(staging_dir))  # every rank: FSDP gathers the shards here
    except BaseException:
        if trainer.is_world_process_zero():
            shutil.rmtree(staging_dir, ignore_errors=True)
        raise
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        if final_dir.exists():
            shutil.rmtree(final_dir)
        staging_dir.rename(final_dir)
        logger.info("final model and tokenizer saved in %s", final_dir)
