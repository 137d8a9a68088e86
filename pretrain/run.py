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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import psutil
import transformers
from transformers import GPT2Config, PreTrainedTokenizerBase, Trainer, TrainingArguments, set_seed

from common.cli import InputError, entry_point, parse_args
from common.corpus import CorpusArguments
from common.run_contract import FINAL_MODEL_DIR, GPT_SUMMARY_FILE, NVIDIA_SMI_FILE, TENSORBOARD_DIR
from common.tokenization import load_tokenizer
from pretrain.args import ModelArguments, PretrainArguments, ReportArguments
from pretrain.batches import BlockSchedule, collate_blocks, global_batch_blocks
from pretrain.blocks.args import DataArguments
from pretrain.blocks.packing import copy_document_split, load_blocks, prepare_blocks, read_stats
from pretrain.callbacks import (
    CheckpointOnSignalCallback,
    FootprintCallback,
    ThroughputCallback,
    continue_tensorboard_log,
    find_tensorboard_callback,
)
from pretrain.checkpoints import checkpoint_global_step, resolve_resume_checkpoint, save_final_model
from pretrain.gpu import accelerator_name, peak_flops_per_second
from pretrain.library_fixes import (
    apply_library_fixes,
    quiet_deepspeed_cpu_notice,
    trainer_creation_environment,
)
from pretrain.loss import use_chunked_loss
from pretrain.model import build_model, build_model_config, count_parameters, flops_per_token
from pretrain.precision import PrecisionChoice, resolve_precision
from pretrain.strategy import (
    Request,
    Strategy,
    check_processes_joined,
    check_request_fits_device,
    check_strategy,
    requested_strategy,
)
from pretrain.summary import (
    OutcomeRecord,
    ParallelismRecord,
    PlanRecord,
    RunSummary,
    SetupRecord,
    final_training_loss,
    replica_checksums,
)

logger = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """What is decided before any weight exists: the checked inputs, the data, the steps."""

    tokenizer: PreTrainedTokenizerBase
    model_config: GPT2Config
    precision: PrecisionChoice
    blocks: datasets.DatasetDict
    schedule: BlockSchedule
    resume_checkpoint: Path | None
    request: Request
    record: PlanRecord


@dataclass
class TrainerSetup:
    """A Trainer ready to train, the callbacks the run reads back, and what was built."""

    trainer: Trainer
    strategy: Strategy
    throughput: ThroughputCallback
    footprint: FootprintCallback
    stop_on_signal: CheckpointOnSignalCallback
    record: SetupRecord


def pretrain(args: PretrainArguments, launched_at: float) -> int:
    """Check the inputs and plan the run, build the trainer, train, summarise; the exit code."""
    plan = plan_run(args)
    setup = build_trainer(args, plan)
    stopped_by = train(setup, plan)
    if stopped_by is not None:
        return 128 + int(stopped_by)
    summary = summarise(args, plan, setup, launched_at)
    if setup.trainer.is_world_process_zero():
        output_dir = Path(args.training.output_dir)
        summary.write(output_dir / GPT_SUMMARY_FILE)
        print(f"{summary.headline()}; run folder {output_dir}")
    return 0


def plan_run(args: PretrainArguments) -> RunPlan:
    """Check everything that can be checked cheaply, then prepare the blocks and count steps."""
    training_args, data_args = args.training, args.data
    check_processes_joined(training_args)
    request = requested_strategy(training_args)
    check_request_fits_device(request, training_args.device)
    precision = resolve_precision(training_args)
    tokenizer = load_tokenizer(data_args.tokenizer_dir)
    model_config = build_model_config(
        args.model.model_preset,
        tokenizer,
        data_args.block_size,
        vocab_size=args.model.vocab_size,
        dropout=args.model.dropout,
        attn_implementation=args.model.attn_implementation,
    )
    batch_blocks = global_batch_blocks(training_args)
    check_budget_fills_a_batch(data_args, training_args, batch_blocks)
    with training_args.main_process_first(local=False, desc="checking the run folder"):
        resume_checkpoint = resolve_resume_checkpoint(
            training_args.output_dir,
            training_args.resume_from_checkpoint,
            remove_incomplete=training_args.should_save,
        )
    # The main process builds the cache; the others then find it ready (shared filesystem).
    with training_args.main_process_first(local=False, desc="preparing packed blocks"):
        cache_dir = prepare_blocks(args.corpus, data_args, tokenizer)
    blocks = load_blocks(cache_dir)
    schedule = BlockSchedule.one_pass(
        len(blocks["train"]), batch_blocks, data_args.block_size, training_args.max_steps
    )
    training_args.max_steps = schedule.max_steps
    logger.info(
        "%s training blocks of %d tokens, global batch %d blocks (%s tokens): %d steps",
        f"{schedule.num_train_blocks:,}",
        schedule.block_size,
        schedule.batch_blocks,
        f"{schedule.batch_tokens:,}",
        schedule.max_steps,
    )
    record = PlanRecord(
        max_steps=schedule.max_steps,
        global_batch_tokens=schedule.batch_tokens,
        resumed_from_step=checkpoint_global_step(resume_checkpoint) if resume_checkpoint else 0,
        data={"cache_dir": str(cache_dir), **read_stats(cache_dir)},
    )
    return RunPlan(
        tokenizer, model_config, precision, blocks, schedule, resume_checkpoint, request, record
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
    apply_library_fixes()
    with trainer_creation_environment(tensorboard_dir, args.model.compile_regions):
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=plan.blocks["train"],
            eval_dataset=plan.blocks["validation"] if len(plan.blocks["validation"]) else None,
            data_collator=collate_blocks,
            processing_class=plan.tokenizer,
            callbacks=[stop_on_signal],
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
        continue_tensorboard_log(tensorboard, tensorboard_dir, plan.record.resumed_from_step)
    model_flops_per_token = flops_per_token(model, args.data.block_size)
    peak_tflops = args.report.peak_tflops
    throughput = ThroughputCallback(
        tensorboard,
        plan.schedule,
        flops_per_token=model_flops_per_token,
        peak_flops_per_second=(
            peak_tflops * 1e12
            if peak_tflops
            else peak_flops_per_second(accelerator_name(training_args.device))
        ),
        num_devices=training_args.world_size,
        snapshot_path=output_dir / NVIDIA_SMI_FILE,
    )
    trainer.add_callback(throughput)
    footprint = FootprintCallback()
    trainer.add_callback(footprint)
    record = SetupRecord(
        num_parameters=count_parameters(model),
        flops_per_token=model_flops_per_token,
        num_processes=training_args.world_size,
        accelerator_state=accelerator_state,
        speed_settings=speed_settings(args, plan.precision, model.config),
        config={
            **args.to_dict(),
            "model_config": model.config.to_dict(),
            "precision_source": plan.precision.source,
        },
    )
    return TrainerSetup(trainer, strategy, throughput, footprint, stop_on_signal, record)


def speed_settings(
    args: PretrainArguments, precision: PrecisionChoice, model_config: GPT2Config
) -> dict[str, Any]:
    """The settings that decide how fast a step runs, under the names the ablation table uses."""
    training_args = args.training
    return {
        "precision": "fp32" if precision.mixed_precision == "no" else precision.mixed_precision,
        "tf32": precision.tf32,
        "compile": training_args.torch_compile,
        "compile_regions": training_args.torch_compile and args.model.compile_regions,
        "attn_implementation": model_config._attn_implementation,
        "fused_adamw": training_args.optim == "adamw_torch_fused",
        "loss_implementation": args.model.loss_implementation,
        "batch": training_args.per_device_train_batch_size,
        "grad_accum": training_args.gradient_accumulation_steps,
        "dataloader_num_workers": training_args.dataloader_num_workers,
    }


def train(setup: TrainerSetup, plan: RunPlan) -> signal.Signals | None:
    """Train to the end and save `final/`; or the signal that stopped training at a checkpoint."""
    trainer = setup.trainer
    resume = plan.resume_checkpoint
    if trainer.is_world_process_zero():
        copy_document_split(plan.record.data["cache_dir"], trainer.args.output_dir)
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
    save_final_model(trainer, Path(trainer.args.output_dir) / FINAL_MODEL_DIR)
    return None


def summarise(
    args: PretrainArguments, plan: RunPlan, setup: TrainerSetup, launched_at: float
) -> RunSummary:
    """Evaluate once, then gather every part of the run summary."""
    trainer = setup.trainer
    eval_loss = trainer.evaluate()["eval_loss"] if trainer.eval_dataset is not None else None
    final_loss, window = final_training_loss(
        trainer.state.log_history, args.report.final_loss_window
    )
    outcome = OutcomeRecord(
        global_step=trainer.state.global_step,
        tokens_trained=plan.schedule.tokens_seen(trainer.state.global_step),
        final_loss=final_loss,
        final_loss_window=window,
        loss_threshold=args.report.loss_threshold,
        eval_loss=eval_loss,
        validation_tokens_per_byte=validation_tokens_per_byte(plan.record.data),
        replica_checksums=replica_checksums(trainer),
    )
    parallelism = ParallelismRecord(
        strategy=setup.strategy.name,
        distributed_type=setup.strategy.distributed_type,
        num_processes=setup.strategy.num_processes,
        ranks=setup.footprint.ranks,
    )
    return RunSummary(
        wall_seconds=time.time() - launched_at,
        plan=plan.record,
        setup=setup.record,
        loop=setup.throughput.loop_record(),
        outcome=outcome,
        parallelism=parallelism,
    )


def validation_tokens_per_byte(data_stats: dict[str, Any]) -> float | None:
    """Predicted tokens per byte of the validation text the loss is measured on (None without
    validation blocks)."""
    validation = data_stats["splits"]["validation"]
    if not validation["num_evaluated_bytes"]:
        return None
    return validation["num_evaluated_tokens"] / validation["num_evaluated_bytes"]


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
