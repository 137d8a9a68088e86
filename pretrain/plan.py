"""What both training loops decide before the first step, in one record (`RunPlan`): the
tokenizer, the model's shape, the packed blocks (built by the main process first), the steps of
one pass over them, the checkpoint to resume from; then the model as built (`RunSetup`).
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
from transformers import GPT2Config, PreTrainedTokenizerBase

from common.cli import InputError
from common.run_contract import (
    GPT_SUMMARY_FILE,
    read_gpt_summary,
)
from common.tokenization import load_tokenizer
from pretrain.args import PrecisionChoice, PretrainArguments, budget_in_whole_batches, resolve_steps
from pretrain.batches import BlockSchedule
from pretrain.blocks.args import DataArguments
from pretrain.blocks.cache import load_blocks, prepare_blocks, read_stats
from pretrain.checkpoints import (
    RESUME_AUTO,
    check_same_run,
    checkpoint_global_step,
    conversion_needed,
    convert_checkpoint,
    identity_differences,
    launched_strategy,
    resolve_resume_checkpoint,
    run_identity,
)
from pretrain.stops import stop_grace_seconds, stop_with_launcher

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunPlan:
    """The run as decided before its first step (`plan_run`), for both loops and the summary."""

    tokenizer: PreTrainedTokenizerBase
    model_config: GPT2Config
    blocks: datasets.DatasetDict
    data: dict[str, Any]  # the packed-block cache folder and its stats.json
    schedule: BlockSchedule
    precision: PrecisionChoice
    final_loss_window: int
    loss_threshold: float
    token_budget: int | None = None  # --max_train_tokens as asked (the run may round it up)
    expected_final_loss: tuple[float, float] | None = None  # the prediction and its margin
    resume_checkpoint: Path | None = None
    resumed_from_step: int = 0
    run_identity: dict[str, Any] | None = None  # what its checkpoints record (Trainer's loop)
    skipped_checkpoints: list[dict[str, str]] = field(default_factory=list)  # with why
    finished: dict[str, Any] | None = None  # the summary, when it finished in the folder already


@dataclass(frozen=True)
class RunSetup:
    """The model as built, as the summary records it (`RunShell.describe`): the settings, its
    size and cost, and the speed settings under the names the ablation table uses."""

    config: dict[str, Any]
    num_parameters: int
    flops_per_token: float
    peak_flops_per_second: float | None
    speed_settings: dict[str, Any]


def plan_run(
    args: PretrainArguments,
    batch_blocks: int,
    precision: PrecisionChoice,
    model_checks: Sequence[Callable[[GPT2Config], None]] = (),
    checkpoints: bool = False,
) -> RunPlan:
    """Check everything that can be checked cheaply (`model_checks` refuse a shape the loop
    cannot split; a loop with `checkpoints` resolves --resume_from_checkpoint before
    tokenizing), then prepare the blocks and count the steps of a global batch of
    `batch_blocks`; `precision`: what the loop trains in."""
    training_args, data_args = args.training, args.data
    stop_grace_seconds()  # refused now, not at the first checkpoint
    stop_with_launcher()
    tokenizer = load_tokenizer(data_args.tokenizer_dir)
    model_config = args.model.model_config(tokenizer, data_args.block_size)
    for check in model_checks:
        check(model_config)
    check_budget_fills_a_batch(data_args, batch_blocks)
    output_dir = Path(training_args.output_dir)
    resume_checkpoint, skipped = None, []
    # A run that finished in the folder is left as it is: no checkpoint judged or moved.
    finished_here = (
        training_args.resume_from_checkpoint == RESUME_AUTO
        and (output_dir / GPT_SUMMARY_FILE).is_file()
    )
    if checkpoints and not finished_here:
        with training_args.main_process_first(local=False, desc="checking the run folder"):
            resume_checkpoint, skipped = resolve_resume_checkpoint(
                output_dir, training_args.resume_from_checkpoint, is_main=training_args.should_save
            )
        if resume_checkpoint is not None:
            launched, is_main = launched_strategy(training_args), training_args.process_index == 0
            if conversion_needed(resume_checkpoint, launched, is_main):
                with training_args.main_process_first(local=False, desc="converting a checkpoint"):
                    resume_checkpoint = convert_checkpoint(
                        resume_checkpoint, launched, output_dir, is_main
                    )
    budgeted = budget_in_whole_batches(args, batch_blocks)
    # The main process builds the cache; the others then find it ready (shared filesystem).
    with training_args.main_process_first(local=False, desc="preparing packed blocks"):
        cache_dir = prepare_blocks(args.corpus, budgeted, tokenizer)
    blocks = load_blocks(cache_dir)
    num_train_blocks = len(blocks["train"])
    schedule = resolve_steps(training_args, num_train_blocks, batch_blocks, data_args.block_size)
    data = {"cache_dir": str(cache_dir), **read_stats(cache_dir)}
    identity = finished = None
    if checkpoints:
        identity = run_identity(training_args, data, model_config, schedule)
        identity |= args.optimizer.identity()
        if finished_here:
            finished = check_finished_run(output_dir, identity, data_args.tokenizer_dir)
        if resume_checkpoint is not None:
            is_main = training_args.process_index == 0
            check_same_run(resume_checkpoint, identity, data_args.tokenizer_dir, is_main)
    return RunPlan(
        tokenizer,
        model_config,
        blocks,
        data,
        schedule,
        precision,
        args.report.final_loss_window,
        args.report.loss_threshold,
        token_budget=data_args.max_train_tokens,
        expected_final_loss=args.report.prediction,
        resume_checkpoint=resume_checkpoint,
        resumed_from_step=checkpoint_global_step(resume_checkpoint) if resume_checkpoint else 0,
        run_identity=identity,
        skipped_checkpoints=skipped,
        finished=finished,
    )


def check_finished_run(
    output_dir: Path, identity: dict[str, Any], tokenizer_dir: str | Path
) -> dict[str, Any]:
    """The summary of the run that finished in `output_dir` when it is this run, else refused."""
    finished = read_gpt_summary(output_dir)
    saved = finished.get("run_identity")
    if not isinstance(saved, dict):  # summaries before version 3 have none
        raise InputError(
            f"run folder {output_dir} holds a finished run whose {GPT_SUMMARY_FILE} (summary "
            f"version {finished.get('summary_version')}) records no run identity: it cannot be "
            "compared with these settings; start a new run in another --output_dir"
        )
    if differences := identity_differences(saved, identity, tokenizer_dir, where="in that run"):
        raise InputError(
            f"run folder {output_dir} holds a finished run of other settings "
            f"({'; '.join(differences)}); start a new run in another --output_dir"
        )
    return finished


def check_budget_fills_a_batch(data_args: DataArguments, batch_blocks: int) -> None:
    """Refuse a token budget below one optimizer step before tokenizing anything."""
    batch_tokens = batch_blocks * data_args.block_size
    if data_args.max_train_tokens is not None and data_args.max_train_tokens < batch_tokens:
        # The loop's batch, not TrainingArguments': the TP/PP loop's is one process's blocks.
        raise InputError(
            f"--max_train_tokens {data_args.max_train_tokens:,} is less than one global batch of "
            f"{batch_tokens:,} tokens ({batch_blocks} blocks of {data_args.block_size}); "
            "raise the budget or lower the batch"
        )
