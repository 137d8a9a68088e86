"""Pretrain GPT-2 from scratch on packed Web of Science blocks with transformers' Trainer.

    accelerate launch [--config_file accelerate_configs/X.yaml] pretrain/run.py \\
        --config pretrain/configs/gpt2_117m.yaml [--flag value ...]
    python pretrain/run.py --config pretrain/configs/tiny.yaml --corpus ... --tokenizer_dir ...

The run folder (`--output_dir`) receives `checkpoint-<step>/`, `tensorboard/`,
`nvidia-smi.txt` (with a GPU), `final/` (model + tokenizer, loadable with
`AutoModelForCausalLM`) and, last, `run_summary.json`.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import psutil
import transformers
from accelerate.utils import gather_object
from transformers import GPT2Config, PreTrainedTokenizerBase, Trainer, TrainingArguments, set_seed

from common.cli import InputError, RunFailed, entry_point, parse_args
from common.corpus import CorpusArguments
from common.files import write_json_atomic
from common.run_contract import FINAL_MODEL_DIR, GPT_SUMMARY_FILE, NVIDIA_SMI_FILE, TENSORBOARD_DIR
from common.tokenization import load_tokenizer
from pretrain.args import ModelArguments, PretrainArguments, ReportArguments
from pretrain.batches import BlockSchedule, collate_blocks, global_batch_blocks
from pretrain.blocks.args import DataArguments
from pretrain.blocks.cache import copy_document_split, load_blocks, prepare_blocks, read_stats
from pretrain.checkpoints import (
    RESUME_AUTO,
    CheckpointManifestCallback,
    CheckpointOnSignalCallback,
    DivergenceCallback,
    check_same_run,
    checkpoint_global_step,
    finished_run_summary,
    resolve_resume_checkpoint,
    run_identity,
)
from pretrain.library_fixes import (
    apply_library_fixes,
    quiet_deepspeed_cpu_notice,
    trainer_creation_environment,
)
from pretrain.loss import use_chunked_loss
from pretrain.metrics import (
    FootprintCallback,
    LoopClock,
    ThroughputCallback,
    continue_tensorboard_log,
    find_tensorboard_callback,
    flops_per_token,
    job_peak_flops_per_second,
)
from pretrain.model import build_model, count_parameters
from pretrain.parallel.strategy import (
    Request,
    check_processes_joined,
    check_request_fits_device,
    check_strategy,
    requested_strategy,
)
from pretrain.precision import PrecisionChoice, resolve_precision
from pretrain.run_folder import failed_saves_in_one_line, hold_run_folder, save_final_model
from pretrain.summary import (
    LoopResult,
    RunSetup,
    headline,
    parameter_checksum,
    run_summary,
    speed_settings,
)

logger = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """What is decided before any weight exists: the checked inputs, the data, the steps."""

    tokenizer: PreTrainedTokenizerBase
    model_config: GPT2Config
    precision: PrecisionChoice
    blocks: datasets.DatasetDict
    data: dict[str, Any]  # the cache folder and its stats.json
    schedule: BlockSchedule
    resume_checkpoint: Path | None
    resumed_from_step: int
    identity: dict[str, Any]  # what a checkpoint of this run records (pretrain/checkpoints.py)
    request: Request


@dataclass
class TrainerSetup:
    """A Trainer ready to train, the callbacks the run reads back, and what was decided."""

    trainer: Trainer
    clock: LoopClock
    footprint: FootprintCallback
    stop_on_signal: CheckpointOnSignalCallback
    divergence: DivergenceCallback
    run: RunSetup


def pretrain(args: PretrainArguments, launched_at: float) -> int:
    """Check the inputs and plan the run, build the trainer, train, summarise; the exit code.

    The run holds its folder for its lifetime; a failed save is one line (RunFailed), and so
    is a run that diverged, after its summary is written.
    """
    training_args = args.training
    # Before the folder lock: processes that did not join would each take it as rank 0.
    check_processes_joined(training_args)
    output_dir = Path(training_args.output_dir)
    finished = finished_run_summary(output_dir)
    if finished is not None and training_args.resume_from_checkpoint == RESUME_AUTO:
        if training_args.process_index == 0:
            print(f"run folder {output_dir} holds a finished run ({headline(finished)}); "
                  "nothing to do")  # fmt: skip
        return 0
    with hold_run_folder(output_dir, training_args):
        plan = plan_run(args)
        setup = build_trainer(args, plan)
        is_main = setup.trainer.is_world_process_zero()
        # Weights and two AdamW moments in fp32: about what a checkpoint takes on disk.
        checkpoint_bytes = 12 * setup.run.num_parameters
        with failed_saves_in_one_line(output_dir, checkpoint_bytes, is_main):
            stopped_by = train(setup, plan)
            if stopped_by is not None:
                return 128 + int(stopped_by)
            summary = run_summary(setup.run, measure(setup, plan), launched_at)
            if is_main:
                write_json_atomic(output_dir / GPT_SUMMARY_FILE, summary)
                print(f"{headline(summary)}; run folder {output_dir}")
    if summary["diverged"]:
        raise RunFailed(
            f"training diverged at step {summary['diverged_at_step']} "
            f"({summary['divergence']}) and stopped; {output_dir}/{GPT_SUMMARY_FILE} records the "
            "run as diverged, with no final/ model; lower --learning_rate or lengthen "
            "--warmup_steps, and start a new run"
        )
    return 0


def plan_run(args: PretrainArguments) -> RunPlan:
    """Check everything that can be checked cheaply, then prepare the blocks and count steps."""
    training_args, data_args = args.training, args.data
    request = requested_strategy(training_args)
    check_request_fits_device(request, training_args.device)
    precision = resolve_precision(training_args)
    tokenizer = load_tokenizer(data_args.tokenizer_dir)
    model_config = args.model.model_config(tokenizer, data_args.block_size)
    batch_blocks = global_batch_blocks(training_args)
    check_budget_fills_a_batch(data_args, training_args, batch_blocks)
    with training_args.main_process_first(local=False, desc="checking the run folder"):
        resume_checkpoint = resolve_resume_checkpoint(
            training_args.output_dir,
            training_args.resume_from_checkpoint,
            remove_unusable=training_args.should_save,
        )
    # The main process builds the cache; the others then find it ready (shared filesystem).
    with training_args.main_process_first(local=False, desc="preparing packed blocks"):
        cache_dir = prepare_blocks(args.corpus, data_args, tokenizer)
    blocks = load_blocks(cache_dir)
    schedule = BlockSchedule.one_pass(
        len(blocks["train"]), batch_blocks, data_args.block_size, training_args.max_steps
    )
    training_args.max_steps = schedule.max_steps
    data = {"cache_dir": str(cache_dir), **read_stats(cache_dir)}
    identity = run_identity(training_args, data, model_config, schedule)
    if resume_checkpoint is not None:
        check_same_run(resume_checkpoint, identity)
    logger.info(
        "%s training blocks of %d tokens, global batch %d blocks (%s tokens): %d steps",
        f"{schedule.num_train_blocks:,}",
        schedule.block_size,
        schedule.batch_blocks,
        f"{schedule.batch_tokens:,}",
        schedule.max_steps,
    )
    return RunPlan(
        tokenizer=tokenizer,
        model_config=model_config,
        precision=precision,
        blocks=blocks,
        data=data,
        schedule=schedule,
        resume_checkpoint=resume_checkpoint,
        resumed_from_step=checkpoint_global_step(resume_checkpoint) if resume_checkpoint else 0,
        identity=identity,
        request=request,
    )


def check_budget_fills_a_batch(
    data_args: DataArguments, training_args: TrainingArguments, batch_blocks: int
) -> None:
    """Refuse a token budget below one optimizer step before tokenizing anything."""
    batch_tokens = batch_blocks * data_args.block_size
    if data_args.max_train_tokens is not None and data_args.max_train_tokens < batch_tokens:
        raise InputError(
            f"--max_train_tokens {data_args.max_train_tokens:,} is less than one global batch of "
            f"{batch_tokens:,} tokens ({training_args.world_size} processes x "
            f"{training_args.per_device_train_batch_size} blocks x "
            f"{training_args.gradient_accumulation_steps} accumulation x {data_args.block_size}); "
            "raise the budget or lower the batch"
        )


def build_trainer(args: PretrainArguments, plan: RunPlan) -> TrainerSetup:
    """The random model, the Trainer around it (accelerate set up inside) and our callbacks."""
    training_args = args.training
    set_seed(training_args.seed)  # the random initial weights are part of the experiment
    model = build_model(plan.model_config)
    if args.model.loss_implementation == "chunked":
        use_chunked_loss(model)
    output_dir = Path(training_args.output_dir)
    tensorboard_dir = output_dir / TENSORBOARD_DIR
    # The run reports the validation loss only; keeping the logits would hold validation
    # blocks x 1024 x vocabulary floats.
    training_args.prediction_loss_only = True
    if "tensorboard" not in training_args.report_to:
        training_args.report_to = [*training_args.report_to, "tensorboard"]
    stop_on_signal = CheckpointOnSignalCallback()
    divergence = DivergenceCallback()
    apply_library_fixes()
    with trainer_creation_environment(tensorboard_dir, args.model.compile_regions):
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=plan.blocks["train"],
            eval_dataset=plan.blocks["validation"] if len(plan.blocks["validation"]) else None,
            data_collator=collate_blocks,
            processing_class=plan.tokenizer,
            callbacks=[stop_on_signal, divergence, CheckpointManifestCallback(plan.identity)],
        )
    # From here accelerate has set up the processes, devices and precision it will train with.
    accelerator_state = str(trainer.accelerator.state)
    logger.info("accelerator state:\n%s", accelerator_state)
    strategy = check_strategy(plan.request, trainer.accelerator)
    logger.info(
        "parallelism: %s (%s, %d processes), as requested",
        strategy.name,
        strategy.distributed_type,
        strategy.num_processes,
    )

    tensorboard = find_tensorboard_callback(trainer)
    if tensorboard is not None and trainer.is_world_process_zero():
        continue_tensorboard_log(tensorboard, tensorboard_dir, plan.resumed_from_step)
    run = RunSetup(
        config={
            **args.to_dict(),
            "model_config": model.config.to_dict(),
            "precision_source": plan.precision.source,
        },
        final_loss_window=args.report.final_loss_window,
        loss_threshold=args.report.loss_threshold,
        schedule=plan.schedule,
        data=plan.data,
        num_parameters=count_parameters(model),
        flops_per_token=flops_per_token(model, args.data.block_size),
        peak_flops_per_second=job_peak_flops_per_second(
            args.report.peak_tflops, training_args.device, training_args.world_size
        ),
        strategy=strategy,
        accelerator_state=accelerator_state,
        speed_settings=speed_settings(
            args.model,
            training_args,
            precision=plan.precision.name,
            tf32=plan.precision.tf32,
            model_config=model.config,
        ),
    )
    clock = LoopClock(
        plan.schedule,
        run.flops_per_token,
        run.peak_flops_per_second,
        training_args.device,
        snapshot_path=output_dir / NVIDIA_SMI_FILE,
    )
    trainer.add_callback(ThroughputCallback(tensorboard, clock))
    footprint = FootprintCallback()
    trainer.add_callback(footprint)
    return TrainerSetup(trainer, clock, footprint, stop_on_signal, divergence, run)


def train(setup: TrainerSetup, plan: RunPlan) -> signal.Signals | None:
    """Train to the end and save `final/` (not for a run that diverged); or the signal that
    stopped training at a checkpoint."""
    trainer = setup.trainer
    resume = plan.resume_checkpoint
    if trainer.is_world_process_zero():
        copy_document_split(plan.data["cache_dir"], trainer.args.output_dir)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    stop = setup.stop_on_signal
    if stop.stopped_at_step is not None:
        logger.warning(
            "stopped by %s at step %d of %d after saving a checkpoint; continue with "
            "--resume_from_checkpoint auto",
            stop.received.name,
            stop.stopped_at_step,
            plan.schedule.max_steps,
        )
        return stop.received
    if setup.divergence.diverged_at_step is None:
        save_final_model(trainer, Path(trainer.args.output_dir) / FINAL_MODEL_DIR)
    return None


def measure(setup: TrainerSetup, plan: RunPlan) -> LoopResult:
    """Evaluate once (unless the run diverged), then collect what the loop measured."""
    trainer = setup.trainer
    divergence = setup.divergence
    eval_loss = None
    if trainer.eval_dataset is not None and divergence.diverged_at_step is None:
        eval_loss = trainer.evaluate()["eval_loss"]
    return LoopResult(
        start_step=plan.resumed_from_step,
        global_step=trainer.state.global_step,
        logged_losses=[entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        eval_loss=eval_loss,
        loop_seconds=setup.clock.loop_seconds,
        first_step_seconds=setup.clock.first_step_seconds,
        ranks=setup.footprint.ranks,
        replica_checksums=replica_checksums(trainer),
        diverged_at_step=divergence.diverged_at_step,
        divergence=divergence.reading,
    )


def replica_checksums(trainer: Trainer) -> list[str] | None:
    """One parameter checksum per process (None when the parameters are sharded)."""
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    return gather_object([parameter_checksum(model)])


def parse_pretrain_args(argv: list[str] | None = None) -> PretrainArguments:
    """(model, corpus, data, report, training) arguments from flags and `--config`."""
    return PretrainArguments(
        *parse_args(
            (ModelArguments, CorpusArguments, DataArguments, ReportArguments, TrainingArguments),
            argv,
            description="Pretrain GPT-2 from scratch on packed blocks (transformers Trainer).",
            prog="pretrain/run.py",
        )
    )


@contextmanager
def library_progress_bars(enabled: bool) -> Iterator[None]:
    """`--disable_tqdm` reaches only Trainer's own bars; hide those of datasets (tokenizing,
    saving blocks) and transformers (writing model shards) too while the run lasts."""
    datasets_bars = datasets.utils.is_progress_bar_enabled()
    transformers_bars = transformers.utils.logging.is_progress_bar_enabled()
    if not enabled:
        datasets.utils.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if datasets_bars and not enabled:
            datasets.utils.enable_progress_bars()
        if transformers_bars and not enabled:
            transformers.utils.logging.enable_progress_bar()


@entry_point
def main(argv: list[str] | None = None) -> int:
    launched_at = psutil.Process().create_time()
    args = parse_pretrain_args(argv)
    quiet_deepspeed_cpu_notice()
    with library_progress_bars(enabled=not args.training.disable_tqdm):
        return pretrain(args, launched_at)


if __name__ == "__main__":
    sys.exit(main())
