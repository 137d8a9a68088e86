"""Tensor and pipeline parallelism for the GPT-2 pretraining, with a training loop of our own.

    torchrun --standalone --nproc_per_node 2 -m pretrain.parallel.train --strategy tp \\
        --config pretrain/configs/tiny.yaml --max_steps 32 --output_dir runs/demo/tp
    torchrun --standalone --nproc_per_node 2 -m pretrain.parallel.train --strategy pp \\
        --pipeline_schedule 1f1b --num_microbatches 4 --config pretrain/configs/tiny.yaml \\
        --max_steps 32 --output_dir runs/demo/pp
    python -m pretrain.parallel.train --strategy single --config pretrain/configs/tiny.yaml \\
        --max_steps 32 --output_dir runs/demo/single     # the one-process reference

Trainer (pretrain/run.py) runs the data-parallel strategies (DDP, FSDP, ZeRO), where every
process holds the whole model, or a shard of it gathered back for each layer; it cannot split
a layer's computation (tensor parallelism, pretrain/parallel/tensor.py) or send activations
from process to process (pipeline parallelism, pretrain/parallel/pipeline.py). This loop runs
those, and `single`, the same loop in one process, as the reference. All three read the same
options and YAML configs as pretrain/run.py and train alike: the same packed blocks in the same
seeded order, the same random initial weights (--seed), transformers' causal-LM loss, the
optimizer that --optim names with Trainer's weight-decay groups, the --lr_scheduler_type
schedule and --max_grad_norm clipping over the whole model. Every process sees every block
(neither strategy splits the batch): a step is --per_device_train_batch_size blocks. With
--dropout 0 (the default) the losses of tp and pp equal single's up to rounding.

`--output_dir` receives `model_parallel_summary.json`: the per-step losses and gradient norms,
step time, tokens/s and what each process held (pretrain/footprint.py). Training is fp32 and
eager; no checkpoints, evaluation or TensorBoard.
"""

from __future__ import annotations

import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from transformers import GPT2LMHeadModel, Trainer, TrainingArguments, get_scheduler, set_seed

from common.cli import InputError, entry_point, parse_args
from common.corpus import CorpusArguments
from common.files import write_json_atomic
from common.run_contract import MODEL_PARALLEL_SUMMARY_FILE
from common.system import hardware_description, library_versions
from common.tokenization import load_tokenizer
from pretrain.args import ModelArguments, resolved_options
from pretrain.batches import BlockSchedule
from pretrain.blocks.args import DataArguments
from pretrain.blocks.packing import load_blocks, prepare_blocks
from pretrain.footprint import gather_footprints, rank_footprint
from pretrain.model import build_model, build_model_config, count_parameters
from pretrain.parallel.pipeline import (
    PIPELINE_SCHEDULES,
    build_gpt2_pipeline,
    check_pipeline_arguments,
)
from pretrain.parallel.tensor import check_tensor_parallel_size, clip_grad_norm_, parallelize_gpt2
from pretrain.strategy import check_processes_joined

logger = logging.getLogger(__name__)

STRATEGIES = ("single", "tp", "pp")


@dataclass
class ParallelArguments:
    """How the model is split across the processes that torchrun starts."""

    strategy: str = field(
        default="single",
        metadata={
            "help": "'single': one process, the reference; 'tp': tensor parallel, every "
            "layer's matrices split across the processes; 'pp': pipeline parallel, consecutive "
            "layers on each process, microbatches flowing through them."
        },
    )
    pipeline_schedule: str = field(
        default="1f1b",
        metadata={
            "help": "With --strategy pp: 'gpipe' (all forwards, then all backwards) or '1f1b' "
            "(one forward, one backward in turn: fewer activations held)."
        },
    )
    num_microbatches: int = field(
        default=4,
        metadata={
            "help": "With --strategy pp: microbatches per step; must divide "
            "--per_device_train_batch_size, and be at least the number of stages for 1f1b."
        },
    )

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InputError(f"--strategy {self.strategy} is not one of {', '.join(STRATEGIES)}")
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise InputError(
                f"--pipeline_schedule {self.pipeline_schedule} is not one of "
                f"{', '.join(PIPELINE_SCHEDULES)}"
            )


ARGUMENT_TYPES = (
    ParallelArguments,
    ModelArguments,
    CorpusArguments,
    DataArguments,
    TrainingArguments,
)


@dataclass
class LocalModel:
    """The part of the model this process trains, and how a batch goes through it."""

    module: nn.Module
    forward_backward: Callable[[torch.Tensor], torch.Tensor | None]  # the loss where known
    clip_grad_norm_: Callable[[float], torch.Tensor]  # returns the whole model's norm
    loss_rank: int  # the process that sees the loss
    tied_weight_difference: Callable[[], float | None] = lambda: None


@dataclass
class LoopRecord:
    """What the training loop measured (losses on the loss rank only)."""

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)


def check_launch(strategy: str, training_args: TrainingArguments) -> None:
    """Refuse a launch whose processes do not fit the strategy or did not join one group."""
    check_processes_joined(training_args)
    launched = training_args.world_size
    if strategy == "single" and launched > 1:
        raise InputError(
            f"--strategy single runs in one process, but {launched} were started; run it "
            "with python -m pretrain.parallel.train, or pick --strategy tp or pp"
        )
    if strategy != "single" and launched < 2:
        raise InputError(
            f"--strategy {strategy} splits the model across processes, but only one was "
            "started; launch it with torchrun --standalone --nproc_per_node 2 (or more)"
        )
    if training_args.gradient_accumulation_steps != 1:
        raise InputError(
            f"--gradient_accumulation_steps {training_args.gradient_accumulation_steps} is not "
            "supported here; the pipeline's microbatches are its accumulation "
            "(--num_microbatches), so pass --gradient_accumulation_steps 1"
        )
    if training_args.fp16 or training_args.bf16:
        raise InputError(
            "this loop trains in fp32 so that the strategies compare exactly; drop --fp16/--bf16"
        )


def warn_unused_options(model_args: ModelArguments, training_args: TrainingArguments) -> None:
    """Name, in one line, the options of pretrain/run.py that this loop does not apply."""
    unused = []
    if model_args.loss_implementation != "hf":
        unused.append(
            f"--loss_implementation {model_args.loss_implementation} (the loss is "
            "transformers' cross-entropy over the full logits)"
        )
    if training_args.torch_compile:
        unused.append("--torch_compile (the model runs eagerly)")
    if training_args.save_strategy != "no":
        unused.append(f"--save_strategy {training_args.save_strategy.value} (no checkpoints)")
    if training_args.eval_strategy != "no":
        unused.append(f"--eval_strategy {training_args.eval_strategy.value} (no evaluation)")
    if training_args.report_to:
        unused.append(f"--report_to {','.join(training_args.report_to)} (no logger but the log)")
    if unused:
        logger.warning("not applied by this loop: %s", "; ".join(unused))


def build_local_model(
    strategy: str,
    model: GPT2LMHeadModel,
    device: torch.device,
    parallel_args: ParallelArguments,
) -> LocalModel:
    """Split `model` (the same on every process) for `strategy`; keep this process's part."""
    if strategy == "pp":
        pipeline = build_gpt2_pipeline(
            model, device, parallel_args.pipeline_schedule, parallel_args.num_microbatches
        )
        return LocalModel(
            module=pipeline.stage,
            forward_backward=pipeline.forward_backward,
            clip_grad_norm_=pipeline.clip_grad_norm_,
            loss_rank=dist.get_world_size() - 1,
            tied_weight_difference=pipeline.tied_weight_difference,
        )
    model.to(device)
    if strategy == "tp":
        parallelize_gpt2(model, init_device_mesh(device.type, (dist.get_world_size(),)))

    def forward_backward(input_ids: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        return loss.detach()

    parameters = list(model.parameters())
    return LocalModel(
        module=model,
        forward_backward=forward_backward,
        clip_grad_norm_=lambda max_norm: clip_grad_norm_(parameters, max_norm),
        loss_rank=0,
    )


def build_optimizer(module: nn.Module, training_args: TrainingArguments) -> torch.optim.Optimizer:
    """The optimizer Trainer would build for `module`: --optim with its settings, weight decay
    on all but biases and layer norms.

    The groups are also split into sharded (DTensor) and whole parameters, which fused and
    foreach kernels cannot take in one call.
    """
    # Trainer's own rule; the method does not use the Trainer instance.
    decay_names = set(Trainer.get_decay_parameter_names(None, module))
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, parameter in module.named_parameters():
        key = (name in decay_names, isinstance(parameter, DTensor))
        groups.setdefault(key, []).append(parameter)
    optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(training_args)
    return optimizer_cls(
        [
            {"params": params, "weight_decay": training_args.weight_decay if decay else 0.0}
            for (decay, _), params in groups.items()
        ],
        **optimizer_kwargs,
    )


def train_steps(
    local: LocalModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batches: Iterable[torch.Tensor],
    num_steps: int,
    training_args: TrainingArguments,
) -> LoopRecord:
    """One optimizer step per batch; each step timed to the end of its device work."""
    device = training_args.device
    max_norm = training_args.max_grad_norm if training_args.max_grad_norm > 0 else math.inf
    # As Trainer reads it: below 1, a fraction of the steps.
    log_every = training_args.logging_steps
    if log_every < 1:
        log_every = math.ceil(num_steps * log_every)
    record = LoopRecord()
    for step, batch in enumerate(batches, start=1):
        started = time.perf_counter()
        loss = local.forward_backward(batch.to(device))
        grad_norm = local.clip_grad_norm_(max_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        record.step_seconds.append(time.perf_counter() - started)
        record.grad_norms.append(grad_norm.item())
        if loss is not None:
            record.losses.append(loss.item())
            if step == 1 or step % log_every == 0 or step == num_steps:
                logger.info(
                    "step %d/%d: loss %.4f, grad norm %.3f, %.3f s",
                    step,
                    num_steps,
                    record.losses[-1],
                    record.grad_norms[-1],
                    record.step_seconds[-1],
                )
    return record


def batches_in_seeded_order(
    train_blocks: datasets.Dataset, schedule: BlockSchedule, seed: int
) -> Iterator[torch.Tensor]:
    """Every step's token ids (batch_blocks, block_size), the same on every process and for
    every strategy: a seeded permutation of the blocks, read in order. A last step that the
    blocks do not fill takes the first blocks again, so every step has the same size."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(schedule.num_train_blocks, generator=generator)
    for step in range(schedule.max_steps):
        positions = torch.arange(step * schedule.batch_blocks, (step + 1) * schedule.batch_blocks)
        indices = order[positions % schedule.num_train_blocks].tolist()
        yield train_blocks[indices]["input_ids"]  # int64 (batch_blocks, block_size)


def from_rank(source_rank: int, value: Any) -> Any:
    """`value` as held by `source_rank`, on every process (a collective: all call it)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=source_rank)
    return box[0]


def train_model_parallel(
    parallel_args: ParallelArguments,
    model_args: ModelArguments,
    corpus_args: CorpusArguments,
    data_args: DataArguments,
    training_args: TrainingArguments,
) -> dict[str, Any]:
    """Prepare the data, split the model, train; return the summary (the same on every rank)."""
    strategy = parallel_args.strategy
    check_launch(strategy, training_args)
    warn_unused_options(model_args, training_args)
    tokenizer = load_tokenizer(data_args.tokenizer_dir)
    model_config = build_model_config(
        model_args.model_preset,
        tokenizer,
        data_args.block_size,
        vocab_size=model_args.vocab_size,
        dropout=model_args.dropout,
        attn_implementation=model_args.attn_implementation,
    )
    batch_blocks = training_args.per_device_train_batch_size
    if strategy == "tp":
        check_tensor_parallel_size(model_config.n_head, training_args.world_size)
    if strategy == "pp":
        check_pipeline_arguments(
            model_config.n_layer,
            training_args.world_size,
            parallel_args.pipeline_schedule,
            parallel_args.num_microbatches,
            batch_blocks,
        )
    with training_args.main_process_first(local=False, desc="preparing packed blocks"):
        cache_dir = prepare_blocks(corpus_args, data_args, tokenizer)
    train_blocks = load_blocks(cache_dir)["train"]
    schedule = BlockSchedule.one_pass(
        len(train_blocks), batch_blocks, data_args.block_size, training_args.max_steps
    )
    batches = batches_in_seeded_order(train_blocks, schedule, training_args.seed)

    set_seed(training_args.seed)  # the same initial weights in every process and strategy
    model = build_model(model_config)
    num_parameters = count_parameters(model)
    local = build_local_model(strategy, model, training_args.device, parallel_args)
    optimizer = build_optimizer(local.module, training_args)
    scheduler = get_scheduler(
        training_args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=training_args.get_warmup_steps(schedule.max_steps),
        num_training_steps=schedule.max_steps,
        scheduler_specific_kwargs=training_args.lr_scheduler_kwargs,
    )
    logger.info(
        "%s over %d process(es): %d steps of %d blocks x %d tokens",
        strategy,
        training_args.world_size,
        schedule.max_steps,
        batch_blocks,
        data_args.block_size,
    )
    record = train_steps(local, optimizer, scheduler, batches, schedule.max_steps, training_args)

    footprint = gather_footprints(rank_footprint(local.module, optimizer, training_args.device))
    losses, tied_difference = from_rank(
        local.loss_rank, (record.losses, local.tied_weight_difference())
    )
    step_seconds = statistics.median(record.step_seconds[1:] or record.step_seconds)
    is_pipeline = strategy == "pp"
    return {
        "strategy": strategy,
        "num_processes": training_args.world_size,
        "device": training_args.device.type,
        "pipeline_schedule": parallel_args.pipeline_schedule if is_pipeline else None,
        "num_microbatches": parallel_args.num_microbatches if is_pipeline else None,
        "max_steps": schedule.max_steps,
        "global_batch_tokens": schedule.batch_tokens,
        "num_parameters": num_parameters,
        "losses": losses,
        "grad_norms": record.grad_norms,
        "final_loss": losses[-1],
        "first_step_seconds": record.step_seconds[0],
        "step_seconds": step_seconds,
        "tokens_per_second": schedule.batch_tokens / step_seconds,
        "footprint": footprint,
        "tied_weight_max_difference": tied_difference,
        "hardware": hardware_description(),
        "versions": library_versions(),
        "config": resolved_options(
            parallel_args, model_args, corpus_args, data_args, training_args
        ),
    }


@entry_point
def main(argv: list[str] | None = None) -> int:
    arguments = parse_args(
        ARGUMENT_TYPES, argv, description=__doc__, prog="python -m pretrain.parallel.train"
    )
    training_args = arguments[-1]
    summary = train_model_parallel(*arguments)
    if training_args.process_index == 0:
        path = Path(training_args.output_dir) / MODEL_PARALLEL_SUMMARY_FILE
        write_json_atomic(path, summary)
        logger.info(
            "final loss %.4f, %.0f tokens/s; summary in %s",
            summary["final_loss"],
            summary["tokens_per_second"],
            path,
        )
    if dist.is_initialized():
        # Without the barrier, gloo sometimes aborts at exit while a peer is still shutting down.
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
