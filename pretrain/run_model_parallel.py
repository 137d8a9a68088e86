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

import logging
import math
import sys
from dataclasses import dataclass

import common  # noqa: F401 (first: Ctrl-C while torch imports is one line)

# isort: split
import torch
import torch.distributed as dist
from accelerate.data_loader import SeedableRandomSampler
from accelerate.utils import broadcast_object_list
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.tensorboard import SummaryWriter
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerState,
    TrainingArguments,
    get_scheduler,
)
from transformers.hf_argparser import HfArg

from common.cli import InputError
from common.run_contract import EVAL_LOSS, GRAD_NORM, LEARNING_RATE, TRAIN_LOSS
from pretrain.args import PrecisionChoice
from pretrain.optim import MuonArguments, decay_parameter_names, muon_optimizer, split_by_layout
from pretrain.parallel.pipeline import (
    PIPELINE_SCHEDULES,
    build_gpt2_pipeline,
    check_pipeline_arguments,
)
from pretrain.parallel.strategy import Strategy
from pretrain.parallel.tensor import check_tensor_parallel_size, clip_grad_norm_, parallelize_gpt2
from pretrain.shell import RunShell, command
from pretrain.summary import LoopResult, replica_checksums

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
        return torch.stack([self.module(input_ids=b, labels=b).loss for b in input_ids[:, None]])

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        return clip_grad_norm_(self.module.parameters(), max_norm)

    def checks(self) -> dict[str, float]:
        return {}


def build_optimizer(
    module: nn.Module, training_args: TrainingArguments, muon_args: MuonArguments
) -> torch.optim.Optimizer:
    """The optimizer Trainer would build for `module` (Muon as `muon_args` ask, else --optim with
    weight decay on all but biases and norms), each group split into DTensor and whole ones."""
    if (muon := muon_optimizer(module, training_args, muon_args)) is not None:
        return muon
    decay_names = decay_parameter_names(module)
    optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(training_args)
    param_groups = split_by_layout([
        {"params": [p for n, p in module.named_parameters() if (n in decay_names) == decay],
         "weight_decay": training_args.weight_decay if decay else 0.0}
        for decay in (True, False)
    ])  # fmt: skip
    return optimizer_cls(param_groups, **optimizer_kwargs)


class ModelParallelRun(RunShell):
    """This loop in the run's shell: the model split for --strategy, Trainer's optimizer and
    schedule, one optimizer step per batch, logged as Trainer logs."""

    option_classes = (ParallelArguments,)
    prog = "python -m pretrain.run_model_parallel"

    @property
    def batch_blocks(self) -> int:
        return self.training_args.per_device_train_batch_size  # every process sees the batch

    def check_launch(self) -> None:
        (self.parallel,) = self.options
        strategy, training_args = self.parallel.strategy, self.training_args
        launched = training_args.world_size  # all joined one training: the shell checked
        if strategy == "single" and launched > 1:
            raise InputError(
                f"--strategy single runs in one process, but {launched} were started; run it "
                "with python -m pretrain.run_model_parallel, or pick --strategy tp or pp"
            )
        if strategy != "single" and launched < 2:
            raise InputError(
                f"--strategy {strategy} splits the model across processes, but only one was "
                "started; launch it with torchrun --standalone --nproc_per_node 2 (or more)"
            )
        if training_args.gradient_accumulation_steps != 1:
            raise InputError(
                f"--gradient_accumulation_steps {training_args.gradient_accumulation_steps} is "
                "not supported here; the pipeline's microbatches are its accumulation "
                "(--num_microbatches), so pass --gradient_accumulation_steps 1"
            )
        if training_args.fp16 or training_args.bf16:
            raise InputError(
                "this loop trains in fp32 so that the strategies compare exactly; drop "
                "--fp16/--bf16"
            )

    def precision(self) -> PrecisionChoice:
        """fp32, eager, transformers' loss, no checkpoints, one evaluation at the end."""
        model_args, training_args = self.args.model, self.training_args
        unused = []
        if model_args.loss_implementation != "hf":
            unused.append(
                f"--loss_implementation {model_args.loss_implementation} (the loss is "
                "transformers' cross-entropy over the full logits)"
            )
            model_args.loss_implementation = "hf"
        if training_args.torch_compile:
            unused.append("--torch_compile (the model runs eagerly)")
            training_args.torch_compile = False
        if training_args.save_strategy != "no":
            unused.append(f"--save_strategy {training_args.save_strategy.value} (no checkpoints)")
        if training_args.eval_strategy != "no":
            unused.append(
                f"--eval_strategy {training_args.eval_strategy.value} (one evaluation at the end)"
            )
        if unused:
            logger.warning("not applied by this loop: %s", "; ".join(unused))
        return PrecisionChoice("no", "this loop trains in fp32", tf32=False)

    def check_model(self, config: GPT2Config, last_batch_blocks: int | None = None) -> None:
        parallel, world_size = self.parallel, self.training_args.world_size
        if parallel.strategy == "tp":
            check_tensor_parallel_size(config.n_head, world_size)
        elif parallel.strategy == "pp":  # the last step's blocks once planned (`build`)
            check_pipeline_arguments(
                config.n_layer, world_size, parallel.pipeline_schedule,
                parallel.num_microbatches, self.batch_blocks, last_batch_blocks,
            )  # fmt: skip

    def build(self, model: GPT2LMHeadModel) -> tuple[Strategy, str]:
        parallel, training_args, schedule = self.parallel, self.training_args, self.plan.schedule
        world_size, device = training_args.world_size, training_args.device
        # The model (the same on every process) split for the strategy; this process's part.
        if parallel.strategy == "pp":
            self.check_model(model.config, schedule.last_batch_blocks)
            self.local = build_gpt2_pipeline(
                model, device, parallel.pipeline_schedule, parallel.num_microbatches
            )
        else:
            model.to(device)
            if parallel.strategy == "tp":
                parallelize_gpt2(model, init_device_mesh(device.type, (world_size,)))
            self.local = WholeModel(model)
        self.optimizer = build_optimizer(self.local.module, training_args, self.args.optimizer)
        self.scheduler = get_scheduler(
            training_args.lr_scheduler_type,
            self.optimizer,
            num_warmup_steps=training_args.get_warmup_steps(schedule.max_steps),
            num_training_steps=schedule.max_steps,
            scheduler_specific_kwargs=training_args.lr_scheduler_kwargs,
        )
        logger.info(
            "%s over %d process(es): %d steps of %d blocks x %d tokens",
            parallel.strategy_name,
            world_size,
            schedule.max_steps,
            self.batch_blocks,
            schedule.block_size,
        )
        # The process that sees the loss: the pipeline's last stage, else every process (rank 0).
        self.loss_rank = world_size - 1 if parallel.strategy == "pp" else 0
        is_loss_rank = training_args.process_index == self.loss_rank
        self.writer = SummaryWriter(str(self.tensorboard_dir)) if is_loss_rank else None
        state = (
            f"torch.distributed {dist.get_backend()}, {world_size} processes, device {device}"
            if dist.is_initialized()
            else f"one process, device {device}"
        )
        strategy = Strategy(parallel.strategy_name, LOOP_STRATEGIES[parallel.strategy], world_size)
        return strategy, state

    def train(self) -> None:
        """One optimizer step per batch; each logging window's mean loss, last grad norm and
        learning rate and speed to TensorBoard; a NaN or infinite gradient norm (the whole
        model's, the same on every process) stops every process at the same step."""
        local, optimizer, clock, plan = self.local, self.optimizer, self.clock, self.plan
        training_args, writer, schedule = self.training_args, self.writer, plan.schedule
        max_norm = training_args.max_grad_norm if training_args.max_grad_norm > 0 else math.inf
        state = TrainerState()
        state.compute_steps(training_args, schedule.max_steps)  # Trainer's logging interval
        # Every step's token ids, the same on every process and in the order Trainer reads
        # them: accelerate's seeded sampler over the blocks, the last batch partial when the
        # blocks do not fill it.
        order = list(
            SeedableRandomSampler(range(schedule.num_train_blocks), data_seed=training_args.seed)
        )
        self.logged_losses: list[float] = []
        window_losses: list[torch.Tensor] = []
        clock.start(0)
        for step in range(1, schedule.max_steps + 1):
            indices = order[(step - 1) * schedule.batch_blocks : step * schedule.batch_blocks]
            batch = plan.blocks["train"][indices]["input_ids"]  # int64 (blocks, block_size)
            learning_rate = self.scheduler.get_last_lr()[0]
            loss = local.forward_backward(batch.to(training_args.device))
            grad_norm = local.clip_grad_norm_(max_norm)
            optimizer.step()
            self.scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if loss is not None:
                window_losses.append(loss)
            clock.step_done()
            self.last_step = step
            grad_norm = grad_norm.item()
            if self.diverged(step, {"grad_norm": grad_norm}):
                break
            if step % state.logging_steps and not (step == 1 and training_args.logging_first_step):
                continue
            scalars = clock.window(step)  # after the device's work: the loss is read below
            if loss is None:
                continue
            window_loss = torch.stack(window_losses).mean().item()
            window_losses.clear()
            self.logged_losses.append(window_loss)
            scalars |= {TRAIN_LOSS: window_loss, GRAD_NORM: grad_norm, LEARNING_RATE: learning_rate}
            if writer is not None:  # the loss rank's line alone, not one per process
                logger.info(clock.progress_line(step, window_loss, learning_rate, scalars))
                for tag, value in scalars.items():
                    writer.add_scalar(tag, value, step)
        clock.stop(local.module, optimizer)

    @torch.no_grad()
    def measure(self, evaluate: bool) -> LoopResult:
        """The validation loss (the mean of each block's, as Trainer's for blocks of equal
        length) on the loss rank, then on every process."""
        local, writer, max_steps = self.local, self.writer, self.plan.schedule.max_steps
        eval_loss = None
        if evaluate:
            local.module.eval()
            blocks = self.plan.blocks["validation"][:]["input_ids"].to(self.training_args.device)
            losses = local.evaluate(blocks)
            eval_loss = None if losses is None else losses.mean().item()
        if writer is not None:
            if eval_loss is not None:
                writer.add_scalar(EVAL_LOSS, eval_loss, max_steps)
            writer.close()
        logged_losses, eval_loss, checks = broadcast_object_list(
            [self.logged_losses, eval_loss, local.checks()], self.loss_rank
        )
        return LoopResult(
            global_step=self.last_step,
            logged_losses=logged_losses,
            eval_loss=eval_loss,
            # Sharded parameters differ between processes by design: no replicas to compare.
            replica_checksums=replica_checksums(local.module, self.parallel.strategy != "single"),
            checks=checks,
        )

    def close(self, shared: bool) -> None:
        # The processes meet at the barrier only when all end alike (done, bad input, diverged):
        # another error may be one process's alone while its peers wait in a collective; it
        # exits, and the launcher stops them. Without the barrier, gloo sometimes aborts at exit
        # while a peer is shutting down.
        if shared and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


main = command(ModelParallelRun)

if __name__ == "__main__":
    sys.exit(main())
