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
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from accelerate.utils import gather_object
from transformers import Trainer, TrainingArguments, set_seed

from common.cli import InputError, entry_point, parse_args
from common.corpus import CorpusArguments
from common.files import write_json_atomic
from common.gpu import NVIDIA_SMI_FILE, peak_flops_per_second
from pretrain.args import ModelArguments, ReportArguments
from pretrain.callbacks import CheckpointOnSignalCallback, ThroughputCallback
from pretrain.checkpoints import (
    FINAL_MODEL_DIR,
    SUMMARY_FILE,
    checkpoint_global_step,
    resolve_resume_checkpoint,
)
from pretrain.data import DataArguments, load_blocks, load_tokenizer, prepare_blocks, read_stats
from pretrain.loss import use_chunked_loss
from pretrain.model import build_model, build_model_config, count_parameters, flops_per_token
from pretrain.precision import resolve_precision
from pretrain.summary import (
    build_run_summary,
    config_as_dict,
    final_training_loss,
    process_start_time,
)
from pretrain.training import (
    collate_blocks,
    continue_tensorboard_log,
    derive_max_steps,
    find_tensorboard_callback,
    global_batch_blocks,
    parameter_checksum,
    tokens_seen,
    trainer_creation_environment,
)

logger = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"


def pretrain(
    model_args: ModelArguments,
    corpus_args: CorpusArguments,
    data_args: DataArguments,
    report_args: ReportArguments,
    training_args: TrainingArguments,
    launched_at: float,
) -> int:
    """Check the inputs, prepare the data, train, evaluate once, save; return the exit code."""
    launched_processes = int(os.environ.get("WORLD_SIZE", "1"))
    if launched_processes != training_args.world_size:
        raise InputError(
            f"the launcher started {launched_processes} processes but they did not join one "
            f"training ({training_args.world_size} seen): on CPU pass --use_cpu true (or set "
            "ACCELERATE_USE_CPU=1), else check that every process sees its GPU"
        )
    precision = resolve_precision(training_args)
    tokenizer = load_tokenizer(data_args.tokenizer_dir)
    model_config = build_model_config(
        model_args.model_preset,
        tokenizer,
        data_args.block_size,
        vocab_size=model_args.vocab_size,
        dropout=model_args.dropout,
        attn_implementation=model_args.attn_implementation,
    )
    batch_blocks = global_batch_blocks(training_args)
    batch_tokens = batch_blocks * data_args.block_size
    if data_args.max_train_tokens is not None and data_args.max_train_tokens < batch_tokens:
        raise InputError(
            f"--max_train_tokens {data_args.max_train_tokens:,} is less than one global batch of "
            f"{batch_tokens:,} tokens ({training_args.world_size} processes x "
            f"{training_args.per_device_train_batch_size} blocks x "
            f"{training_args.gradient_accumulation_steps} accumulation x {data_args.block_size}); "
            "raise the budget or lower the batch"
        )
    output_dir = Path(training_args.output_dir)
    with training_args.main_process_first(local=False, desc="checking the run folder"):
        resume_checkpoint = resolve_resume_checkpoint(
            output_dir,
            training_args.resume_from_checkpoint,
            remove_incomplete=training_args.should_save,
        )
    start_step = 0 if resume_checkpoint is None else checkpoint_global_step(resume_checkpoint)

    # The main process builds the cache; the others then find it ready (shared filesystem).
    with training_args.main_process_first(local=False, desc="preparing packed blocks"):
        cache_dir = prepare_blocks(corpus_args, data_args, tokenizer)
    blocks = load_blocks(cache_dir)
    num_train_blocks = len(blocks["train"])
    training_args.max_steps = derive_max_steps(
        num_train_blocks, batch_blocks, training_args.max_steps
    )
    logger.info(
        "%s training blocks of %d tokens, global batch %d blocks (%s tokens): %d steps",
        f"{num_train_blocks:,}",
        data_args.block_size,
        batch_blocks,
        f"{batch_tokens:,}",
        training_args.max_steps,
    )

    set_seed(training_args.seed)  # the random initial weights are part of the experiment
    model = build_model(model_config)
    if model_args.loss_implementation == "chunked":
        use_chunked_loss(model)
    model_flops_per_token = flops_per_token(model, data_args.block_size)
    peak = (
        report_args.peak_tflops * 1e12
        if report_args.peak_tflops
        else peak_flops_per_second(torch_device_name(training_args))
    )

    tensorboard_dir = output_dir / TENSORBOARD_DIR
    # The run reports the validation loss only; keeping the logits would hold validation
    # blocks x 1024 x vocabulary floats.
    training_args.prediction_loss_only = True
    if "tensorboard" not in training_args.report_to:
        training_args.report_to = [*training_args.report_to, "tensorboard"]
    signal_callback = CheckpointOnSignalCallback()
    with trainer_creation_environment(tensorboard_dir, model_args.compile_regions):
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=blocks["train"],
            eval_dataset=blocks["validation"] if len(blocks["validation"]) else None,
            data_collator=collate_blocks,
            processing_class=tokenizer,
            callbacks=[signal_callback],
        )
    tensorboard = find_tensorboard_callback(trainer)
    throughput = ThroughputCallback(
        tensorboard,
        global_batch_tokens=batch_tokens,
        flops_per_token=model_flops_per_token,
        peak_flops_per_second=peak,
        num_devices=training_args.world_size,
        snapshot_path=output_dir / NVIDIA_SMI_FILE,
    )
    trainer.add_callback(throughput)
    if tensorboard is not None and trainer.is_world_process_zero():
        continue_tensorboard_log(tensorboard, tensorboard_dir, start_step)
    accelerator_state = str(trainer.accelerator.state)
    logger.info("accelerator state:\n%s", accelerator_state)

    trainer.train(resume_from_checkpoint=str(resume_checkpoint) if resume_checkpoint else None)
    if signal_callback.stopped_at_step is not None:
        logger.warning(
            "stopped by %s at step %d of %d after saving a checkpoint; continue with "
            "--resume_from_checkpoint auto",
            signal_callback.received.name,
            signal_callback.stopped_at_step,
            training_args.max_steps,
        )
        return 128 + int(signal_callback.received)

    eval_loss = trainer.evaluate()["eval_loss"] if trainer.eval_dataset is not None else None
    save_final_model(trainer, output_dir / FINAL_MODEL_DIR)
    checksums = replica_checksums(trainer)

    final_loss, window = final_training_loss(
        trainer.state.log_history, report_args.final_loss_window
    )
    session_tokens = tokens_seen(
        throughput.end_step, batch_blocks, num_train_blocks, data_args.block_size
    ) - tokens_seen(throughput.start_step, batch_blocks, num_train_blocks, data_args.block_size)
    loop_seconds = throughput.loop_seconds
    summary = build_run_summary(
        wall_seconds=time.time() - launched_at,
        train_loop_seconds=loop_seconds,
        tokens_trained=tokens_seen(
            trainer.state.global_step, batch_blocks, num_train_blocks, data_args.block_size
        ),
        session_tokens=session_tokens,
        mfu=throughput.mfu(session_tokens / loop_seconds) if loop_seconds else None,
        final_loss=final_loss,
        final_loss_window=window,
        loss_threshold=report_args.loss_threshold,
        eval_loss=eval_loss,
        max_steps=training_args.max_steps,
        global_step=trainer.state.global_step,
        resumed_from_step=start_step,
        global_batch_tokens=batch_tokens,
        num_parameters=count_parameters(model),
        flops_per_token=model_flops_per_token,
        accelerator_state=accelerator_state,
        num_processes=training_args.world_size,
        replica_checksums=checksums,
        config={
            **config_as_dict(model_args, corpus_args, data_args, report_args, training_args),
            "model_config": model.config.to_dict(),
            "precision_source": precision.source,
        },
        data={"cache_dir": str(cache_dir), **read_stats(cache_dir)},
        first_step_seconds=throughput.first_step_seconds,
        peak_memory_gib=peak_memory_gib(training_args),
        speed_settings={
            "precision": "fp32" if precision.mixed_precision == "no" else precision.mixed_precision,
            "tf32": precision.tf32,
            "compile": training_args.torch_compile,
            "compile_regions": training_args.torch_compile and model_args.compile_regions,
            "attn_implementation": model_config._attn_implementation,
            "fused_adamw": training_args.optim == "adamw_torch_fused",
            "loss_implementation": model_args.loss_implementation,
            "batch": training_args.per_device_train_batch_size,
            "grad_accum": training_args.gradient_accumulation_steps,
            "dataloader_num_workers": training_args.dataloader_num_workers,
        },
    )
    if trainer.is_world_process_zero():
        write_json_atomic(output_dir / SUMMARY_FILE, summary)
        verdict = "below" if summary["loss_below_threshold"] else "NOT below"
        print(
            f"final loss {final_loss:.3f} ({verdict} {report_args.loss_threshold:g}), "
            f"eval loss {eval_loss if eval_loss is None else round(eval_loss, 3)}, "
            f"{summary['tokens_per_second'] or 0:,.0f} tokens/s; run folder {output_dir}"
        )
    return 0


def torch_device_name(training_args: TrainingArguments) -> str:
    """The accelerator's marketing name ("NVIDIA H200"), or "cpu"."""
    device = training_args.device
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def peak_memory_gib(training_args: TrainingArguments) -> float | None:
    """The most GPU memory this process's tensors held at once (GiB); None on CPU."""
    device = training_args.device
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


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


def replica_checksums(trainer: Trainer) -> list[str] | None:
    """One parameter checksum per process (None when the parameters are sharded)."""
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    return gather_object([parameter_checksum(model)])


ARGUMENT_TYPES = (
    ModelArguments,
    CorpusArguments,
    DataArguments,
    ReportArguments,
    TrainingArguments,
)


def parse_pretrain_args(argv: list[str] | None = None) -> tuple:
    """(model, corpus, data, report, training) arguments from flags and `--config`."""
    return parse_args(
        ARGUMENT_TYPES,
        argv,
        description="Pretrain GPT-2 from scratch on packed blocks (transformers Trainer).",
        prog="pretrain/run.py",
    )


@entry_point
def main(argv: list[str] | None = None) -> int:
    launched_at = process_start_time()
    return pretrain(*parse_pretrain_args(argv), launched_at=launched_at)


if __name__ == "__main__":
    sys.exit(main())
