"""Tensor and pipeline parallelism for the GPT-2 pretraining, with a training loop of our own.

    torchrun --standalone --nproc_per_node 2 -m pretrain.run_model_parallel --strategy tp \\
        --config pretrain/configs/tiny.yaml --max_steps 32 --output_dir runs/demo/tp
    torchrun --standalone --nproc_per_node 2 -m pretrain.run_model_parallel --strategy pp \\
        --pipeline_schedule 1f1b --num_microbatches 4 --config pretrain/configs/tiny.yaml \\
        --max_steps 32 --output_dir runs/demo/pp
    python -m pretrain.run_model_parallel --strategy single --config pretrain/configs/tiny.yaml \\
        --max_steps 32 --output_dir runs/demo/single     # this loop in one process

Trainer (pretrain/run.py) runs the data-parallel strategies (DDP, FSDP, ZeRO), where every
process holds the whole model, or a shard of it gathered back for each layer; it cannot split
a layer's computation (tensor parallelism, pretrain/parallel/tensor.py) or send activations
from process to process (pipeline parallelism, pretrain/parallel/pipeline.py). This loop runs
those, and `single`, the same loop in one process. It reads the same options and YAML configs
as pretrain/run.py and trains like it: the same packed blocks in the same seeded order (the
sampler Trainer's accelerate uses), the same random initial weights (--seed), transformers'
causal-LM loss, the optimizer that --optim names with Trainer's weight-decay groups, the
--lr_scheduler_type schedule, --max_grad_norm clipping over the whole model, and Trainer's
logging steps. Every process sees every block (neither strategy splits the batch): a step is
--per_device_train_batch_size blocks. With --dropout 0 (the default) the losses equal those of
pretrain/run.py in one process up to rounding.

`--output_dir` becomes a run folder like pretrain/run.py's: `run_summary.json` (the same keys,
written by the same function), `tensorboard/` (the same tags) and `document_split.json`, so
`run-report` shows these runs like any other. Training is fp32 and eager; no checkpoints and
no final/ model (a tensor-parallel model is no longer laid out as a saved GPT-2).
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
import torch.distributed as dist
from accelerate.data_loader import SeedableRandomSampler
from accelerate.utils import broadcast_object_list, gather_object
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.utils.tensorboard import SummaryWriter
from transformers import GPT2LMHeadModel, Trainer, TrainerState, TrainingArguments, get_scheduler
from transformers.hf_argparser import HfArg

from common.cli import InputError, RunFailed, entry_point
from common.run_contract import (
    EVAL_LOSS,
    GRAD_NORM,
    LEARNING_RATE,
    NVIDIA_SMI_FILE,
    TENSORBOARD_DIR,
    TRAIN_LOSS,
)
from pretrain.args import PrecisionChoice, PretrainArguments, drop_unused_options
from pretrain.batches import BlockSchedule
from pretrain.checkpoints import divergence
from pretrain.metrics import LoopClock, TimeBudget, rank_footprint
from pretrain.parallel.pipeline import (
    PIPELINE_SCHEDULES,
    GPT2Pipeline,
    build_gpt2_pipeline,
    check_pipeline_arguments,
)
from pretrain.parallel.strategy import Strategy, check_model_parallel_launch
from pretrain.parallel.tensor import check_tensor_parallel_size, clip_grad_norm_, parallelize_gpt2
from pretrain.plan import plan_run
from pretrain.run_folder import hold_run_folder
from pretrain.shell import build_random_model, describe_run, finish_run
from pretrain.summary import LoopResult, parameter_checksum, run_summary

logger = logging.getLogger(__name__)

# How this loop splits the model, and the distributed type it records for each.
LOOP_STRATEGIES = {"single": "NO", "tp": "TENSOR_PARALLEL", "pp": "PIPELINE_PARALLEL"}


@dataclass
class ParallelArguments:
    """How the model is split across the processes that torchrun starts."""

    strategy: str = HfArg(
        default="single",
        help="'single': one process; 'tp': tensor parallel, every layer's matrices split "
        "across the processes; 'pp': pipeline parallel, consecutive layers on each process, "
        "microbatches flowing through them.",
        metadata={"choices": list(LOOP_STRATEGIES)},
    )
    pipeline_schedule: str = HfArg(
        default="1f1b",
        help="With --strategy pp: 'gpipe' (all forwards, then all backwards) or '1f1b' "
        "(one forward, one backward in turn: fewer activations held).",
        metadata={"choices": list(PIPELINE_SCHEDULES)},
    )
    num_microbatches: int = HfArg(
        default=4,
        help="With --strategy pp: microbatches per step; must divide "
        "--per_device_train_batch_size, and be at least the number of stages for 1f1b.",
    )

    @property
    def strategy_name(self) -> str:
        """The name the run summary and the comparison use: single, tp, pp-gpipe or pp-1f1b."""
        return f"pp-{self.pipeline_schedule}" if self.strategy == "pp" else self.strategy


@dataclass
class WholeModel:
    """The model on every process, whole (single) or each layer's matrices split (tp), driven
    as the loop drives a `GPT2Pipeline`."""

    module: GPT2LMHeadModel

    def forward_backward(self, input_ids: torch.Tensor) -> torch.Tensor:
        loss = self.module(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        return loss.detach()

    def evaluate(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Each block's mean loss, one block at a time."""
        blocks = [block[None] for block in input_ids]
        return torch.stack([self.module(input_ids=block, labels=block).loss for block in blocks])

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        return clip_grad_norm_(self.module.parameters(), max_norm)

    def tied_weight_difference(self) -> None:
        return None


def build_local_model(
    strategy: str,
    model: GPT2LMHeadModel,
    device: torch.device,
    parallel_args: ParallelArguments,
) -> WholeModel | GPT2Pipeline:
    """Split `model` (the same on every process) for `strategy`; keep this process's part."""
    if strategy == "pp":
        return build_gpt2_pipeline(
            model, device, parallel_args.pipeline_schedule, parallel_args.num_microbatches
        )
    model.to(device)
    if strategy == "tp":
        parallelize_gpt2(model, init_device_mesh(device.type, (dist.get_world_size(),)))
    return WholeModel(model)


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
    local: WholeModel | GPT2Pipeline,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batches: Iterator[torch.Tensor],
    training_args: TrainingArguments,
    clock: LoopClock,
    writer: SummaryWriter | None,
) -> tuple[list[float], int, str | None]:
    """One optimizer step per batch, logged as Trainer logs: each logging window's mean loss
    and the last grad norm and learning rate, with the window's speed, to TensorBoard.

    Returns the windows' mean losses (on the loss rank), the last step, and why the loop
    stopped there (a NaN or infinite gradient norm, on every rank) or None."""
    device, num_steps = training_args.device, training_args.max_steps  # plan_run's max_steps
    max_norm = training_args.max_grad_norm if training_args.max_grad_norm > 0 else math.inf
    state = TrainerState()
    state.compute_steps(training_args, num_steps)  # Trainer's logging interval
    log_every = state.logging_steps
    logged_losses: list[float] = []
    window_losses: list[torch.Tensor] = []
    clock.start(0)
    for step, batch in enumerate(batches, start=1):
        learning_rate = scheduler.get_last_lr()[0]
        loss = local.forward_backward(batch.to(device))
        grad_norm = local.clip_grad_norm_(max_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if loss is not None:
            window_losses.append(loss)
        clock.step_done()
        # The whole model's norm, the same on every process: all stop at the same step.
        reading = divergence({"grad_norm": grad_norm.item()})
        if reading is not None:
            logger.error("training diverged at step %d (%s): stopping", step, reading)
            break
        if not (step % log_every == 0 or (step == 1 and training_args.logging_first_step)):
            continue
        scalars = clock.window(step)  # after the device's work: the loss is read below
        if loss is None:
            continue
        window_loss = torch.stack(window_losses).mean().item()
        window_losses.clear()
        logged_losses.append(window_loss)
        scalars |= {
            TRAIN_LOSS: window_loss,
            GRAD_NORM: grad_norm.item(),
            LEARNING_RATE: learning_rate,
        }
        logger.info(
            "step %d/%d: loss %.4f, grad norm %.3f", step, num_steps, window_loss, grad_norm.item()
        )
        if writer is not None:
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, step)
    clock.stop()
    return logged_losses, step, reading


def training_batches(train_blocks: datasets.Dataset, schedule: BlockSchedule, seed: int):
    """Every step's token ids (up to batch_blocks, block_size), the same on every process and
    in the order Trainer reads them: accelerate's seeded sampler over the blocks, consecutive
    batches, the last one partial when the blocks do not fill it."""
    order = list(SeedableRandomSampler(range(schedule.num_train_blocks), data_seed=seed))
    for step in range(schedule.max_steps):
        indices = order[step * schedule.batch_blocks : (step + 1) * schedule.batch_blocks]
        yield train_blocks[indices]["input_ids"]  # int64 (blocks, block_size)


@torch.no_grad()
def evaluate(
    local: WholeModel | GPT2Pipeline, blocks: datasets.Dataset, device: torch.device
) -> float | None:
    """Mean loss over the validation blocks (each block's mean, averaged), on the loss rank, as
    Trainer's evaluation computes it for blocks of equal length."""
    local.module.eval()
    losses = local.evaluate(blocks[:]["input_ids"].to(device))
    return None if losses is None else losses.mean().item()


def train_model_parallel(
    parallel_args: ParallelArguments, args: PretrainArguments, budget: TimeBudget
) -> dict[str, Any]:
    """Plan the run, split the model, train, evaluate; the run summary (on every rank)."""
    strategy, training_args = parallel_args.strategy, args.training
    batch_blocks = training_args.per_device_train_batch_size  # every process sees the batch
    world_size = training_args.world_size
    tp_checks = [lambda config: check_tensor_parallel_size(config.n_head, world_size)]
    plan = plan_run(args, batch_blocks, tp_checks if strategy == "tp" else ())
    budget.lap("data")
    if strategy == "pp":
        check_pipeline_arguments(
            plan.model_config.n_layer,
            training_args.world_size,
            parallel_args.pipeline_schedule,
            parallel_args.num_microbatches,
            batch_blocks,
            last_batch_blocks=plan.schedule.last_batch_blocks,
        )
    model = build_random_model(args, plan)  # the same initial weights as pretrain/run.py's
    device = training_args.device
    run = describe_run(
        args,
        plan,
        model,
        Strategy(parallel_args.strategy_name, LOOP_STRATEGIES[strategy], training_args.world_size),
        accelerator_state=(
            f"torch.distributed {dist.get_backend()}, {training_args.world_size} processes, "
            f"device {device}"
            if dist.is_initialized()
            else f"one process, device {device}"
        ),
        precision=PrecisionChoice("no", "this loop trains in fp32", tf32=False),
        extra_options=(parallel_args,),
    )
    budget.lap("model")
    local = build_local_model(strategy, model, device, parallel_args)
    optimizer = build_optimizer(local.module, training_args)
    schedule = plan.schedule
    scheduler = get_scheduler(
        training_args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=training_args.get_warmup_steps(schedule.max_steps),
        num_training_steps=schedule.max_steps,
        scheduler_specific_kwargs=training_args.lr_scheduler_kwargs,
    )
    logger.info(
        "%s over %d process(es): %d steps of %d blocks x %d tokens",
        run.strategy.name,
        training_args.world_size,
        schedule.max_steps,
        batch_blocks,
        schedule.block_size,
    )
    output_dir = Path(training_args.output_dir)
    # The process that sees the loss: the pipeline's last stage, else every process (rank 0).
    loss_rank = training_args.world_size - 1 if strategy == "pp" else 0
    is_loss_rank = training_args.process_index == loss_rank
    if training_args.process_index == 0:
        plan.copy_document_split(output_dir)
    writer = SummaryWriter(str(output_dir / TENSORBOARD_DIR)) if is_loss_rank else None
    clock = LoopClock(run, device, output_dir / NVIDIA_SMI_FILE, budget)
    batches = training_batches(plan.blocks["train"], schedule, training_args.seed)
    logged_losses, last_step, reading = train_steps(
        local, optimizer, scheduler, batches, training_args, clock, writer
    )
    ranks = gather_object([rank_footprint(local.module, optimizer, device)])
    eval_loss = None if reading else evaluate(local, plan.blocks["validation"], device)
    budget.lap("final_eval")
    if writer is not None:
        if eval_loss is not None:
            writer.add_scalar(EVAL_LOSS, eval_loss, schedule.max_steps)
        writer.close()
    logged_losses, eval_loss, tied_difference = broadcast_object_list(
        [logged_losses, eval_loss, local.tied_weight_difference()], loss_rank
    )
    result = LoopResult(
        start_step=0,
        global_step=last_step,
        logged_losses=logged_losses,
        eval_loss=eval_loss,
        loop_seconds=clock.loop_seconds,
        first_step_seconds=clock.first_step_seconds,
        ranks=ranks,
        # Sharded parameters differ between processes by design: no replicas to compare.
        replica_checksums=[parameter_checksum(local.module)] if strategy == "single" else None,
        checks={} if tied_difference is None else {"tied_weight_max_difference": tied_difference},
        diverged_at_step=last_step if reading else None,
        divergence=reading,
        budget=budget,
    )
    return run_summary(run, result)


@entry_point
def main(argv: list[str] | None = None) -> int:
    budget = TimeBudget()
    parallel_args, args = PretrainArguments.parse(
        argv,
        (ParallelArguments,),
        description=__doc__,
        prog="python -m pretrain.run_model_parallel",
    )
    training_args = args.training
    # Before the folder lock: processes that did not join would each take it as rank 0.
    check_model_parallel_launch(parallel_args.strategy, training_args)
    drop_unused_options(args.model, training_args)
    output_dir = Path(training_args.output_dir)
    try:
        with hold_run_folder(output_dir, training_args):
            budget.lap("trainer_setup")
            summary = train_model_parallel(parallel_args, args, budget)
            finish_run(summary, output_dir, training_args.process_index == 0)
    finally:
        # The processes meet at the barrier only when all end alike (done, bad input, diverged):
        # another error may be one process's alone while its peers wait in a collective; it
        # exits, and the launcher stops them. Without the barrier, gloo sometimes aborts at exit
        # while a peer is shutting down.
        error = sys.exc_info()[1]
        if dist.is_initialized() and (error is None or isinstance(error, InputError | RunFailed)):
            dist.barrier()
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
