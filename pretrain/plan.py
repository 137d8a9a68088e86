"""What both training loops decide before the first step.

Trainer's loop (pretrain/run.py) and the tensor / pipeline-parallel loop
(pretrain/run_model_parallel.py) run the same plan: the tokenizer, the model's shape around it, the
packed blocks (built by the main process first, reused by the others), the steps of one pass
over them (`max_steps` is derived here and nowhere else).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
from transformers import GPT2Config, PreTrainedTokenizerBase

from common.cli import InputError
from common.run_contract import GPT_SUMMARY_FILE, read_gpt_summary
from common.tokenization import load_tokenizer
from pretrain.args import PretrainArguments, budget_in_whole_batches
from pretrain.batches import BlockSchedule
from pretrain.blocks.cache import copy_document_split, load_blocks, prepare_blocks, read_stats
from pretrain.checkpoints import (
    RESUME_AUTO,
    check_same_run,
    checkpoint_global_step,
    identity_differences,
    resolve_resume_checkpoint,
    run_identity,
)

logger = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """What is decided before any weight exists: the inputs, the data, the steps."""

    tokenizer: PreTrainedTokenizerBase
    model_config: GPT2Config
    blocks: datasets.DatasetDict
    data: dict[str, Any]  # the cache folder and its stats.json
    schedule: BlockSchedule
    resume_checkpoint: Path | None = None
    resumed_from_step: int = 0
    identity: dict[str, Any] | None = None  # what a checkpoint of this run records
    skipped_checkpoints: list[dict[str, str]] = field(default_factory=list)
    # The summary of this same run when it already finished in the folder (resuming: nothing
    # to do).
    finished: dict[str, Any] | None = None

    def copy_document_split(self, run_dir: str | Path) -> None:
        """Record in the run folder which documents the blocks' splits hold (for the probe)."""
        copy_document_split(self.data["cache_dir"], run_dir)


def plan_run(
    args: PretrainArguments,
    batch_blocks: int,
    model_checks: Sequence[Callable[[GPT2Config], None]] = (),
    resumable: bool = False,
) -> RunPlan:
    """Check everything that can be checked cheaply, then prepare the blocks and count steps.

    `batch_blocks` is the loop's global batch in blocks; `model_checks` refuse a model shape
    the loop cannot split; a `resumable` loop (Trainer's) resolves --resume_from_checkpoint
    before tokenizing anything, and refuses a checkpoint of another run.
    """
    training_args, data_args = args.training, args.data
    tokenizer = load_tokenizer(data_args.tokenizer_dir)
    model_config = args.model.model_config(tokenizer, data_args.block_size)
    for check in model_checks:
        check(model_config)
    check_budget_fills_a_batch(args, batch_blocks)
    resume_checkpoint, skipped = None, []
    # A run that finished in the folder is left as it is: no checkpoint judged, adopted, moved.
    finished_here = (
        training_args.resume_from_checkpoint == RESUME_AUTO
        and (Path(training_args.output_dir) / GPT_SUMMARY_FILE).is_file()
    )
    if resumable and not finished_here:
        with training_args.main_process_first(local=False, desc="checking the run folder"):
            resume_checkpoint, skipped = resolve_resume_checkpoint(
                training_args.output_dir,
                training_args.resume_from_checkpoint,
                is_main=training_args.should_save,
            )
    # The main process builds the cache; the others then find it ready (shared filesystem).
    with training_args.main_process_first(local=False, desc="preparing packed blocks"):
        cache_dir = prepare_blocks(
            args.corpus, budget_in_whole_batches(args, batch_blocks), tokenizer
        )
    blocks = load_blocks(cache_dir)
    schedule = BlockSchedule.one_pass(
        len(blocks["train"]), batch_blocks, data_args.block_size, training_args.max_steps
    )
    # The one place max_steps is decided: one pass over the budget's blocks.
    training_args.max_steps = schedule.max_steps
    data = {"cache_dir": str(cache_dir), **read_stats(cache_dir)}
    identity = finished = None
    if resumable:
        identity = run_identity(training_args, data, model_config, schedule)
        if finished_here:
            finished = check_finished_run(Path(training_args.output_dir), identity)
        if resume_checkpoint is not None:
            check_same_run(resume_checkpoint, identity, training_args.process_index == 0)
    logger.info(
        "%s training blocks of %d tokens, global batch %d blocks (%s tokens): %d steps",
        f"{schedule.num_train_blocks:,}",
        schedule.block_size,
        schedule.batch_blocks,
        f"{schedule.batch_tokens:,}",
        schedule.max_steps,
    )
    return RunPlan(
        tokenizer,
        model_config,
        blocks,
        data,
        schedule,
        resume_checkpoint,
        checkpoint_global_step(resume_checkpoint) if resume_checkpoint else 0,
        identity,
        skipped,
        finished,
    )


def check_finished_run(output_dir: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of the run that finished in `output_dir` when it is this run (None: no
    finished run); a finished run of other settings is refused, naming what differs."""
    if not (output_dir / GPT_SUMMARY_FILE).is_file():
        return None
    finished = read_gpt_summary(output_dir)
    saved = finished.get("run_identity") or identity  # summaries before version 3 have none
    differences = identity_differences(saved, identity, where="in that run")
    if differences:
        raise InputError(
            f"run folder {output_dir} holds a finished run of other settings "
            f"({'; '.join(differences)}); start a new run in another --output_dir"
        )
    return finished


def check_budget_fills_a_batch(args: PretrainArguments, batch_blocks: int) -> None:
    """Refuse a token budget below one optimizer step before tokenizing anything."""
    data_args = args.data
    batch_tokens = batch_blocks * data_args.block_size
    if data_args.max_train_tokens is not None and data_args.max_train_tokens < batch_tokens:
        # The loop's batch, not TrainingArguments': the TP/PP loop's is one process's blocks.
        raise InputError(
            f"--max_train_tokens {data_args.max_train_tokens:,} is less than one global batch of "
            f"{batch_tokens:,} tokens ({batch_blocks} blocks of {data_args.block_size}); "
            "raise the budget or lower the batch"
        )
