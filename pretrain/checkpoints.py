"""The run folder's guarantees: one run per folder, checkpoints that are whole or ignored, resume
only of the same run, a final model written whole, saves that fail in one line.

- A run holds its folder's lock (`hold_run_folder`) for its lifetime; a second run into the same
  folder is refused, naming the holder. The kernel drops the lock of a killed process.
- Trainer writes `checkpoint-<step>/` file by file; `CheckpointManifestCallback` then records
  every file's size and checksum and what defines the run (`run_identity`) in
  `checkpoint_manifest.json`, written last and atomically. A checkpoint is complete when its
  manifest is there and every file still matches it (`checkpoint_damage`): a save cut short by a
  crash, a full disk or a damaged file never looks complete, and `--resume_from_checkpoint auto`
  takes the newest complete one.
- Resuming checks that the checkpoint's run is this run (same data, tokenizer, budget, global
  batch, model shape and schedule) and names the differences otherwise.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import GPT2Config, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, sort_checkpoints

from common.cli import InputError, RunFailed
from common.files import (
    LOCK_FILE,
    LockHeld,
    damage_in,
    exclusive_lock,
    file_digests,
    write_json_atomic,
)
from common.run_contract import CHECKPOINT_MANIFEST_FILE, FINAL_MODEL_DIR, GPT_SUMMARY_FILE
from pretrain.batches import BlockSchedule
from pretrain.strategy import from_rank

logger = logging.getLogger(__name__)

RESUME_AUTO = "auto"
# Files that mark a finished run in the run folder.
FINISHED_RUN_MARKERS = (GPT_SUMMARY_FILE, FINAL_MODEL_DIR)
# The functions whose failure is a failed save (as opposed to a bug in training).
SAVING_FUNCTIONS = frozenset(
    {"_save_checkpoint", "save_model", "save_final_model", "write_json_atomic", "on_save"}
)


def checkpoint_global_step(checkpoint_dir: Path) -> int | None:
    """The step a checkpoint was saved at, or None if its trainer state is unreadable."""
    try:
        state = json.loads((checkpoint_dir / TRAINER_STATE_NAME).read_text(encoding="utf-8"))
        return int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def list_checkpoints(output_dir: Path) -> list[Path]:
    """`checkpoint-<step>` folders in `output_dir`, newest (highest step) first."""
    return [Path(path) for path in reversed(sort_checkpoints(str(output_dir)))]


def read_manifest(checkpoint_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((checkpoint_dir / CHECKPOINT_MANIFEST_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return None


def checkpoint_damage(checkpoint_dir: Path) -> str | None:
    """Why a checkpoint cannot be resumed from, or None when it is whole."""
    manifest = read_manifest(checkpoint_dir)
    if manifest is None:
        return f"no readable {CHECKPOINT_MANIFEST_FILE} (the save was cut short)"
    return damage_in(checkpoint_dir, manifest["files"])


def run_identity(
    training_args: TrainingArguments,
    data: dict[str, Any],
    model_config: GPT2Config,
    schedule: BlockSchedule,
) -> dict[str, Any]:
    """What makes a run this run: continuing a checkpoint with any of these changed trains
    another model than the one the checkpoint belongs to. The processes and the per-process
    batch may change, as long as the global batch stays."""
    settings = data["settings"]
    return {
        "corpus": data["corpus_fingerprint"],
        "tokenizer": data["tokenizer_files_sha256"],
        "block_size": schedule.block_size,
        "validation_fraction": settings["validation_fraction"],
        "split_seed": settings["split_seed"],
        "max_train_tokens": settings["max_train_tokens"],
        "repeat_corpus": settings["repeat_corpus"],
        "global_batch_blocks": schedule.batch_blocks,
        "max_steps": schedule.max_steps,
        "vocab_size": model_config.vocab_size,
        "n_layer": model_config.n_layer,
        "n_embd": model_config.n_embd,
        "n_head": model_config.n_head,
        "n_positions": model_config.n_positions,
        "optim": str(training_args.optim),
        "learning_rate": training_args.learning_rate,
        "lr_scheduler_type": str(training_args.lr_scheduler_type),
        "lr_scheduler_kwargs": training_args.lr_scheduler_kwargs,
        "warmup_steps": training_args.warmup_steps,
        "weight_decay": training_args.weight_decay,
        "adam_beta1": training_args.adam_beta1,
        "adam_beta2": training_args.adam_beta2,
        "adam_epsilon": training_args.adam_epsilon,
        "max_grad_norm": training_args.max_grad_norm,
        "seed": training_args.seed,
    }


def identity_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`name: X now, Y in the checkpoint` for each item of the run identity that differs."""

    def shown(value: Any) -> str:
        text = json.dumps(value) if isinstance(value, dict | list) else str(value)
        return text[:12] if len(text) == 64 else text  # a SHA-256: its first 12 hex digits

    return [
        f"{name}: {shown(current.get(name))} now, {shown(saved.get(name))} in the checkpoint"
        for name in sorted(set(saved) | set(current))
        if saved.get(name) != current.get(name)
    ]


def resolve_resume_checkpoint(
    output_dir: str | Path, requested: str | None, remove_unusable: bool
) -> Path | None:
    """The checkpoint to resume from (None: start fresh), checking the run folder first.

    `requested` is `--resume_from_checkpoint`: None (a new run: the folder must not hold an
    earlier run), "auto" (the newest complete checkpoint, or a fresh start if there is none),
    or a checkpoint path, which must be complete. With `remove_unusable` (the main process),
    the damaged or incomplete checkpoints newer than the chosen one are deleted, so that
    checkpoint rotation never keeps them instead of good ones.
    """
    output_dir = Path(output_dir)
    checkpoints = list_checkpoints(output_dir)
    if requested is None:
        leftovers = [p.name for p in checkpoints] + [
            name for name in FINISHED_RUN_MARKERS if (output_dir / name).exists()
        ]
        if leftovers:
            raise InputError(
                f"output folder {output_dir} already holds a run ({', '.join(leftovers[:3])}); "
                f"pass --resume_from_checkpoint {RESUME_AUTO} to continue it, or a new --output_dir"
            )
        return None
    if requested != RESUME_AUTO:
        path = Path(requested)
        damage = checkpoint_damage(path) if path.is_dir() else "it does not exist"
        if damage is not None:
            raise InputError(
                f"checkpoint {path} cannot be resumed from: {damage}; pass a complete "
                f"checkpoint folder or --resume_from_checkpoint {RESUME_AUTO}"
            )
        return path
    for checkpoint in checkpoints:
        damage = checkpoint_damage(checkpoint)
        if damage is None:
            logger.info("resuming from %s", checkpoint)
            return checkpoint
        if remove_unusable:
            shutil.rmtree(checkpoint, ignore_errors=True)
        logger.warning(
            "skipping checkpoint %s: %s%s",
            checkpoint,
            damage,
            "; removed" if remove_unusable else "",
        )
    logger.info("no complete checkpoint in %s: starting from step 0", output_dir)
    return None


def check_same_run(checkpoint: Path, identity: dict[str, Any]) -> None:
    """Refuse to resume a checkpoint of another run, naming what differs."""
    differences = identity_differences(read_manifest(checkpoint)["run_identity"], identity)
    if differences:
        raise InputError(
            f"checkpoint {checkpoint} belongs to another run ({'; '.join(differences)}); "
            "resume it with the settings it was saved with, or start a new run in another "
            "--output_dir"
        )


def finished_run_summary(output_dir: Path) -> dict[str, Any] | None:
    """The summary of a run that finished in `output_dir`, or None."""
    try:
        return json.loads((output_dir / GPT_SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class CheckpointManifestCallback(TrainerCallback):
    """Seal each checkpoint once Trainer has written all of it: every file's size and checksum
    and the run's identity, in a manifest written last (by the main process, after every
    process has written its shards)."""

    def __init__(self, identity: dict[str, Any]) -> None:
        self.identity = identity

    def on_save(self, args, state, control, **kwargs):
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if state.is_world_process_zero:
            checkpoint_dir = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            write_json_atomic(
                checkpoint_dir / CHECKPOINT_MANIFEST_FILE,
                {
                    "files": file_digests(checkpoint_dir, skip=(CHECKPOINT_MANIFEST_FILE,)),
                    "run_identity": self.identity,
                },
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
