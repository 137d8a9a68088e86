"""Which checkpoint a run continues from, whether a run folder may be (re)used, the final model.

Trainer writes `checkpoint-<step>/` file by file and `trainer_state.json` last, so a folder
whose `trainer_state.json` is missing or unreadable was cut short (a job killed mid-save) and
must never be resumed from. transformers finds and orders the checkpoints; the completeness
check is ours (its `get_last_checkpoint` returns the newest folder, complete or not).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import sort_checkpoints

from common.cli import InputError
from common.run_contract import FINAL_MODEL_DIR, GPT_SUMMARY_FILE

logger = logging.getLogger(__name__)

RESUME_AUTO = "auto"
# Files that mark a finished run in the run folder.
FINISHED_RUN_MARKERS = (GPT_SUMMARY_FILE, FINAL_MODEL_DIR)


def checkpoint_global_step(checkpoint_dir: Path) -> int | None:
    """The step a checkpoint was saved at, or None if the checkpoint is incomplete."""
    try:
        state = json.loads((checkpoint_dir / TRAINER_STATE_NAME).read_text(encoding="utf-8"))
        return int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def list_checkpoints(output_dir: Path) -> list[Path]:
    """`checkpoint-<step>` folders in `output_dir`, newest (highest step) first."""
    return [Path(path) for path in reversed(sort_checkpoints(str(output_dir)))]


def resolve_resume_checkpoint(
    output_dir: str | Path, requested: str | None, remove_incomplete: bool
) -> Path | None:
    """The checkpoint to resume from (None: start fresh), checking the run folder first.

    `requested` is `--resume_from_checkpoint`: None (a new run: the folder must not hold an
    earlier run), "auto" (the newest complete checkpoint, or a fresh start if there is none),
    or a checkpoint path. With `remove_incomplete` (the main process), incomplete checkpoints
    newer than the chosen one are deleted so that checkpoint rotation never keeps them.
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
        if checkpoint_global_step(path) is None:
            raise InputError(
                f"checkpoint {path} is missing or incomplete (no readable {TRAINER_STATE_NAME}); "
                f"pass a complete checkpoint folder or --resume_from_checkpoint {RESUME_AUTO}"
            )
        return path
    for checkpoint in checkpoints:
        if checkpoint_global_step(checkpoint) is not None:
            logger.info("resuming from %s", checkpoint)
            return checkpoint
        logger.warning("skipping incomplete checkpoint %s (cut short while saving)", checkpoint)
        if remove_incomplete:
            shutil.rmtree(checkpoint, ignore_errors=True)
    logger.info("no complete checkpoint in %s: starting from step 0", output_dir)
    return None


def save_final_model(trainer: Trainer, final_dir: Path) -> None:
    """Model (safetensors) + tokenizer into `final_dir`, which appears only when complete."""
    staging_dir = final_dir.with_name(f".{final_dir.name}.tmp")
    if trainer.is_world_process_zero() and staging_dir.exists():
        shutil.rmtree(staging_dir)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging_dir))  # every rank: FSDP gathers the shards here
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        if final_dir.exists():
            shutil.rmtree(final_dir)
        staging_dir.rename(final_dir)
        logger.info("final model and tokenizer saved in %s", final_dir)
