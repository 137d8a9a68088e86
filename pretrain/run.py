"""Pretrain GPT-2 from scratch on packed Web of Science blocks with transformers' Trainer.

    launch-pretraining [--config_file accelerate_configs/X.yaml] pretrain/run.py \\
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
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from transformers import Trainer

from common.cli import entry_point
from common.run_contract import FINAL_MODEL_DIR, NVIDIA_SMI_FILE, TENSORBOARD_DIR
from pretrain.args import PrecisionChoice, PretrainArguments, resolve_precision
from pretrain.batches import collate_blocks
from pretrain.checkpoints import (
    CheckpointManifestCallback,
    CheckpointOnSignalCallback,
    DivergenceCallback,
    StopRequested,
)
from pretrain.library_fixes import (
    apply_library_fixes,
    compiled_once,
    library_progress_bars,
    quiet_cpu_notices,
    trainer_creation_environment,
    use_compile_cache,
)
from pretrain.metrics import (
    FootprintCallback,
    LoopClock,
    ThroughputCallback,
    TimeBudget,
    continue_tensorboard_log,
    find_tensorboard_callback,
)
from pretrain.parallel.strategy import (
    Request,
    check_processes_joined,
    check_request_fits_device,
    check_strategy,
    requested_strategy,
)
from pretrain.plan import RunPlan, plan_run
from pretrain.run_folder import failures_in_one_line, hold_run_folder, save_final_model
from pretrain.shell import build_random_model, describe_run, finish_run, nothing_to_resume
from pretrain.summary import LoopResult, replica_checksums, run_summary

logger = logging.getLogger(__name__)


def pretrain(args: PretrainArguments, budget: TimeBudget) -> int:
    """Plan the run, build the trainer, train, summarise; the exit code.

    The run holds its folder for its lifetime; a failed save is one line (RunFailed), and so
    is a run that diverged, after its summary is written. SIGTERM or SIGUSR1 before the first
    step stops it at once, during training after a checkpoint (exit code 128 + signal).
    """
    training_args = args.training
    # Before the folder lock: processes that did not join would each take it as rank 0.
    check_processes_joined(training_args)
    output_dir = Path(training_args.output_dir)
    stop_on_signal = CheckpointOnSignalCallback()
    try:
        with stop_on_signal.caught(), hold_run_folder(output_dir, training_args):
            return train_and_summarise(args, stop_on_signal, budget)
    except StopRequested as stop:
        logger.warning(
            "stopped by %s before training started; nothing was kept", stop.received.name
        )
        return 128 + int(stop.received)


def train_and_summarise(
    args: PretrainArguments, stop_on_signal: CheckpointOnSignalCallback, budget: TimeBudget
) -> int:
    """The run in its folder: plan, Trainer, training, final model, evaluation, summary."""
    training_args = args.training
    output_dir = Path(training_args.output_dir)
    request = requested_strategy(training_args)
    check_request_fits_device(request, training_args.device)
    precision = resolve_precision(training_args)
    budget.lap("trainer_setup")
    plan = plan_run(args, training_args.global_batch_blocks, resumable=True)
    budget.lap("data")
    is_main = training_args.process_index == 0
    if plan.finished is not None:
        return nothing_to_resume(plan.finished, output_dir, is_main)
    trainer_run = TrainerRun(args, plan, request, precision, stop_on_signal, budget)
    # Weights and two AdamW moments in fp32: about what a checkpoint takes on disk.
    checkpoint_bytes = 12 * trainer_run.run.num_parameters
    with compiled_once(), failures_in_one_line(output_dir, checkpoint_bytes, is_main):
        stopped_by = trainer_run.train()
        if stopped_by is not None:
            return 128 + int(stopped_by)
        finish_run(run_summary(trainer_run.run, trainer_run.measure()), output_dir, is_main)
    return 0


class TrainerRun:
    """The random model, the Trainer around it (accelerate set up inside) and our callbacks,
    read back after training; the strategy accelerate set up is checked against the one
    `request`ed."""

    def __init__(
        self,
        args: PretrainArguments,
        plan: RunPlan,
        request: Request,
        precision: PrecisionChoice,
        stop_on_signal: CheckpointOnSignalCallback,
        budget: TimeBudget,
    ) -> None:
        training_args = args.training
        model = build_random_model(args, plan)
        budget.lap("model")
        if training_args.torch_compile:
            compile_cache = args.model.compile_cache_dir
            use_compile_cache(
                Path(compile_cache or Path(args.data.cache_dir) / "compile"),
                explicit=bool(compile_cache),
            )
        output_dir = Path(training_args.output_dir)
        tensorboard_dir = output_dir / TENSORBOARD_DIR
        self.plan, self.stop_on_signal = plan, stop_on_signal
        self.divergence = DivergenceCallback()
        self.manifests = CheckpointManifestCallback(plan.identity)
        apply_library_fixes()
        with trainer_creation_environment(tensorboard_dir, args.model.compile_regions):
            self.trainer = trainer = Trainer(
                model=model,
                args=training_args,
                train_dataset=plan.blocks["train"],
                eval_dataset=plan.blocks["validation"],
                data_collator=collate_blocks,
                processing_class=plan.tokenizer,
                callbacks=[stop_on_signal, self.divergence, self.manifests],
            )
        # From here accelerate has set up the processes, devices and precision it will train with.
        accelerator_state = str(trainer.accelerator.state)
        logger.info("accelerator state:\n%s", accelerator_state)
        strategy = check_strategy(request, trainer.accelerator)
        logger.info(
            "parallelism: %s (%s, %d processes), as requested",
            strategy.name,
            strategy.distributed_type,
            strategy.num_processes,
        )
        tensorboard = find_tensorboard_callback(trainer)
        if tensorboard is not None and trainer.is_world_process_zero():
            continue_tensorboard_log(tensorboard, tensorboard_dir, plan.resumed_from_step)
        self.run = describe_run(args, plan, model, strategy, accelerator_state, precision)
        self.clock = LoopClock(self.run, training_args.device, output_dir / NVIDIA_SMI_FILE, budget)
        trainer.add_callback(ThroughputCallback(tensorboard, self.clock))
        self.footprint = FootprintCallback()
        trainer.add_callback(self.footprint)

    def train(self) -> signal.Signals | None:
        """Train to the end and save `final/` (not for a run that diverged); or the signal that
        stopped training at a checkpoint."""
        trainer, resume = self.trainer, self.plan.resume_checkpoint
        if trainer.is_world_process_zero():
            self.plan.copy_document_split(trainer.args.output_dir)
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        self.clock.budget.lap("other")  # Trainer's own work after the loop
        stop = self.stop_on_signal
        if stop.stopped_at_step is not None:
            logger.warning(
                "stopped by %s at step %d of %d after saving a checkpoint; continue with "
                "--resume_from_checkpoint auto",
                stop.received.name,
                stop.stopped_at_step,
                self.plan.schedule.max_steps,
            )
            return stop.received
        if self.divergence.diverged_at_step is None:
            save_final_model(trainer, Path(trainer.args.output_dir) / FINAL_MODEL_DIR)
            self.clock.budget.lap("final_save")
        return None

    def measure(self) -> LoopResult:
        """Evaluate once (unless the run diverged), then collect what the loop measured."""
        trainer, divergence = self.trainer, self.divergence
        eval_loss = None
        if divergence.diverged_at_step is None:
            eval_loss = evaluate_blocks(trainer)
            self.clock.budget.lap("final_eval")
        return LoopResult(
            start_step=self.plan.resumed_from_step,
            global_step=trainer.state.global_step,
            logged_losses=[entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
            eval_loss=eval_loss,
            loop_seconds=self.clock.loop_seconds,
            first_step_seconds=self.clock.first_step_seconds,
            ranks=self.footprint.ranks,
            replica_checksums=replica_checksums(trainer),
            diverged_at_step=divergence.diverged_at_step,
            divergence=divergence.reading,
            budget=self.clock.budget,
            checkpoint_saves=self.manifests.saves,
        )


@torch.no_grad()
def evaluate_blocks(trainer: Trainer) -> float:
    """The validation loss: the mean of each block's loss, whatever the number of processes.

    Trainer's evaluation averages batch means, and the last batch of a process that accelerate
    pads with repeated blocks counts them (3 blocks: 6.453 on 2 processes, 6.460 on one); one
    block per forward, accelerate's `gather_for_metrics` drops the repeats. The weights run
    eagerly: compiled, a no-grad forward is a new graph to compile for one pass
    (docs/BENCHMARKS.md measures both).
    """
    blocks = DataLoader(trainer.eval_dataset, batch_size=1, collate_fn=collate_blocks)
    model = trainer.model_wrapped
    model.eval()
    losses = []
    with torch.compiler.set_stance("force_eager"):
        for batch in trainer.accelerator.prepare(blocks):
            losses.append(trainer.accelerator.gather_for_metrics(model(**batch).loss[None]))
    eval_loss = torch.cat(losses).float().mean().item()
    trainer.log({"eval_loss": eval_loss})  # TensorBoard's eval/loss, the log history
    return eval_loss


def parse_pretrain_args(argv: list[str] | None = None) -> PretrainArguments:
    """(model, corpus, data, report, training) arguments from flags and `--config`."""
    (args,) = PretrainArguments.parse(
        argv, description="Pretrain GPT-2 from scratch on packed blocks (transformers Trainer)."
    )
    return args


@entry_point
def main(argv: list[str] | None = None) -> int:
    budget = TimeBudget()
    quiet_cpu_notices()
    args = parse_pretrain_args(argv)
    with library_progress_bars(enabled=not args.training.disable_tqdm):
        return pretrain(args, budget)


if __name__ == "__main__":
    sys.exit(main())
