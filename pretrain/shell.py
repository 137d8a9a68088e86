"""A pretraining run's life around its training loop, from the launch checks to the exit code,
the same for Trainer's loop (pretrain/run.py) and the tensor / pipeline-parallel loop
(pretrain/run_model_parallel.py): they subclass `RunShell` and supply its hooks. The time budget
is timed here or by the `LoopClock` a loop is given, never in a loop.
"""

import functools
import logging
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

from transformers import GPT2Config, GPT2LMHeadModel, set_seed

from common.cli import InputError, RunFailed, entry_point
from common.files import write_json_atomic
from common.run_contract import (
    FINAL_MODEL_DIR,
    GPT_SUMMARY_FILE,
    NVIDIA_SMI_FILE,
    TENSORBOARD_DIR,
    TIME_DATA,
    TIME_FINAL_EVAL,
    TIME_FINAL_SAVE,
    TIME_LOOP_SETUP,
    TIME_MODEL,
    TIME_OTHER,
)
from pretrain.args import PrecisionChoice, PretrainArguments
from pretrain.blocks.cache import copy_document_split
from pretrain.checkpoints import (
    CheckpointManifestCallback,
    DivergenceCallback,
    divergence,
)
from pretrain.device import check_gpu_when_required
from pretrain.library_fixes import (
    apply_library_fixes,
    compiled_once,
    library_progress_bars,
    quiet_cpu_notices,
    trainer_creation_environment,
    use_compile_cache,
)
from pretrain.loss import use_chunked_loss
from pretrain.metrics import (
    LoopClock,
    TimeBudget,
    cpu_run_estimate,
    flops_per_token,
    job_peak_flops_per_second,
    refuse_cpu_run_over_free_memory,
)
from pretrain.model import build_model
from pretrain.parallel.strategy import Strategy, check_processes_joined
from pretrain.plan import RunSetup, plan_run
from pretrain.run_folder import failures_in_one_line, hold_run_folder, save_final_model
from pretrain.stops import CheckpointOnSignalCallback, StopRequested
from pretrain.summary import LoopResult, headline, run_summary

logger = logging.getLogger(__name__)


class RunShell:
    """One run of a training loop, from its command line (`command`) to its exit code: 0, 2
    for bad input and 3 for a failed run (one line each), 128 + signal for a stop."""

    prog = "pretrain/run.py"
    description: str | None = None  # --help's text; by default the loop module's docstring
    option_classes: tuple[type, ...] = ()  # the loop's own options, parsed first
    checkpoints = False  # the loop's: resumed from, sealed, one saved on SIGTERM/SIGUSR1 to stop
    # Writes the trained model whole into a folder, on every process: final/, loadable by
    # from_pretrained (Trainer's loop); None: the loop leaves no final/.
    write_final_model: Callable[[str], None] | None = None

    def __init__(self, argv: list[str] | None) -> None:
        self.budget = TimeBudget()
        quiet_cpu_notices()
        *self.options, self.args = self.parse(argv)
        self.training_args = self.args.training
        check_gpu_when_required(self.training_args.use_cpu, self.training_args.require_gpu)
        self.output_dir = Path(self.training_args.output_dir)
        self.tensorboard_dir = self.output_dir / TENSORBOARD_DIR
        self.divergence = DivergenceCallback()  # Trainer's callback; a record for other loops
        self.stop_on_signal = CheckpointOnSignalCallback()

    @classmethod
    def parse(cls, argv: list[str] | None) -> tuple[Any, ...]:
        description = cls.description or sys.modules[cls.__module__].__doc__
        return PretrainArguments.parse(argv, cls.option_classes, description, cls.prog)

    # --- The hooks a loop supplies ------------------------------------------------------------

    @property
    def batch_blocks(self) -> int:
        """Blocks per optimizer step, all processes together."""
        return self.training_args.global_batch_blocks

    def check_launch(self) -> None:
        """Refuse, before the folder is taken, a launch this loop cannot run."""

    def precision(self) -> PrecisionChoice:
        """The precision the loop trains in, before any data is read; the options it does not
        apply set to what it does, as the summary records what ran."""
        raise NotImplementedError

    def check_model(self, config: GPT2Config) -> None:
        """Refuse, before any data is read, a model shape this loop cannot split."""

    def build(self, model: GPT2LMHeadModel) -> tuple[Strategy, str]:
        """Set the loop up around `model`; the strategy in force and the processes' state."""
        raise NotImplementedError

    def train(self) -> None:
        """One pass over the planned blocks; stop early where `self.diverged` says so."""
        raise NotImplementedError

    def measure(self, evaluate: bool) -> LoopResult:
        """The steps, losses and checks only the loop knows; the validation loss if `evaluate`."""
        raise NotImplementedError

    def close(self, shared: bool) -> None:
        """After the run however it ended; `shared`: the ending is every process's (done, bad
        input, diverged), not one process's error."""

    # --- The run's life -------------------------------------------------------------------

    def run(self) -> int:
        """The whole run; its exit code."""
        # Before the folder lock: processes that did not join would each take it as rank 0.
        check_processes_joined(self.training_args)
        shared = False  # a stop or an error may be one process's while its peers wait
        try:
            self.check_launch()
            with (
                library_progress_bars(enabled=not self.training_args.disable_tqdm),
                self.stop_on_signal.caught(),  # a loop without checkpoints stops at once
                hold_run_folder(self.output_dir, self.training_args),
            ):
                code, shared = self.plan_and_train(), True
                return code
        except StopRequested as stop:
            when = "before training started" if self.checkpoints else "(this loop saves none)"
            logger.warning("stopped by %s %s; nothing was kept", stop.received.name, when)
            return 128 + int(stop.received)
        except (InputError, RunFailed):
            shared = True
            raise
        finally:
            self.close(shared)

    def plan_and_train(self) -> int:
        """In the held folder: plan, model, loop, training, final model, measurement, summary."""
        args, training_args, budget = self.args, self.training_args, self.budget
        is_main = training_args.process_index == 0
        budget.lap(TIME_LOOP_SETUP)
        precision = self.precision()  # the loop's own policy may turn compile off
        compile_cache = None
        if training_args.torch_compile:
            asked = args.model.compile_cache_dir
            compile_cache = use_compile_cache(
                Path(asked or Path(args.data.cache_dir) / "compile"), bool(asked), self.output_dir
            )
        model_checks = [self.check_model]
        if training_args.device.type == "cpu":
            model_checks.append(functools.partial(refuse_cpu_run_over_free_memory, args))
        self.plan = plan = plan_run(
            args, self.batch_blocks, precision, model_checks, self.checkpoints
        )
        budget.lap(TIME_DATA)
        if plan.finished is not None:
            return self.nothing_to_resume(plan.finished, is_main)
        # Random weights drawn from --seed: the initial weights are part of the experiment, and
        # both loops start from the same ones.
        set_seed(training_args.seed)
        model = build_model(plan.model_config)
        if args.model.loss_implementation == "chunked":
            use_chunked_loss(model)
        setup = self.describe(model)
        if training_args.device.type == "cpu":
            tokens = plan.schedule.tokens_between(plan.resumed_from_step, plan.schedule.max_steps)
            if is_main and (estimate := cpu_run_estimate(args, model, tokens)):
                logger.warning(estimate)
        budget.lap(TIME_MODEL)
        apply_library_fixes()
        self.clock = LoopClock(
            plan, setup, training_args.device, self.output_dir / NVIDIA_SMI_FILE, budget
        )
        self.manifests = CheckpointManifestCallback(plan.run_identity)
        with trainer_creation_environment(self.tensorboard_dir, args.model.compile_regions):
            self.strategy, self.accelerator_state = self.build(model)
        self.manifests.strategy = self.strategy
        if is_main:
            # Which documents the blocks' splits hold, for the probe.
            copy_document_split(plan.data["cache_dir"], self.output_dir)
        saves = failures_in_one_line(self.output_dir, 4 * setup.num_parameters, is_main)  # fp32
        with saves if self.checkpoints else nullcontext(), compiled_once(compile_cache):
            self.train()
            budget.lap(TIME_OTHER)  # the loop's own work after its last step
            stop = self.stop_on_signal
            if stop.stopped_at_step is not None:
                logger.warning(
                    "stopped by %s at step %d of %d after saving a checkpoint; continue with "
                    "--resume_from_checkpoint auto",
                    stop.received.name, stop.stopped_at_step, plan.schedule.max_steps,
                )  # fmt: skip
                return 128 + int(stop.received)
            finite = self.divergence.diverged_at_step is None
            if finite and self.write_final_model is not None:
                save_final_model(self.write_final_model, self.output_dir / FINAL_MODEL_DIR, is_main)
                budget.lap(TIME_FINAL_SAVE)
            result = self.measure(evaluate=finite)
            if finite:
                budget.lap(TIME_FINAL_EVAL)
            self.finish(run_summary(plan, setup, self.completed(result)), is_main)
        return 0

    def describe(self, model: GPT2LMHeadModel) -> RunSetup:
        """The model as built, as the summary records it."""
        plan, args, training_args = self.plan, self.args, self.training_args
        config = {
            **args.to_dict(*self.options),
            "model_config": model.config.to_dict(),
            "precision_source": plan.precision.source,
        }
        speed_settings = {
            "precision": plan.precision.name,
            "tf32": plan.precision.tf32,
            "compile": training_args.torch_compile,
            "compile_regions": training_args.torch_compile and args.model.compile_regions,
            "attn_implementation": model.config._attn_implementation,
            "fused_adamw": training_args.optim == "adamw_torch_fused",
            "loss_implementation": args.model.loss_implementation,
            "batch": training_args.per_device_train_batch_size,
            "grad_accum": training_args.gradient_accumulation_steps,
            "dataloader_num_workers": training_args.dataloader_num_workers,
        }
        peak = job_peak_flops_per_second(
            args.report.peak_tflops, training_args.device, training_args.world_size
        )
        flops = flops_per_token(model, args.data.block_size)
        return RunSetup(config, model.num_parameters(), flops, peak, speed_settings)

    def diverged(self, step: int, readings: dict[str, float | None]) -> bool:
        """Whether one of `readings` at `step` is NaN or infinite, recorded as the divergence (a
        loop of our own: Trainer's has DivergenceCallback)."""
        reading = divergence(readings)
        if reading is not None:
            logger.error("training diverged at step %d (%s): stopping", step, reading)
            self.divergence.diverged_at_step, self.divergence.reading = step, reading
        return reading is not None

    def completed(self, result: LoopResult) -> LoopResult:
        """The loop's result with what the shell measured: the clock's, the divergence, saves."""
        clock = self.clock
        return replace(
            result,
            start_step=self.plan.resumed_from_step,
            loop_seconds=clock.loop_seconds,
            first_step_seconds=clock.first_step_seconds,
            ranks=clock.ranks,
            diverged_at_step=self.divergence.diverged_at_step,
            divergence=self.divergence.reading,
            budget=self.budget,
            checkpoint_saves=self.manifests.saves,
            strategy=self.strategy,
            accelerator_state=self.accelerator_state,
        )

    def finish(self, summary: dict[str, Any], is_main: bool) -> None:
        """Write run_summary.json and print its headline; then fail a diverged run in one line."""
        if is_main:
            write_json_atomic(self.output_dir / GPT_SUMMARY_FILE, summary)
            print(f"{headline(summary)}; run folder {self.output_dir}")
        if summary["verdict"] == "diverged":
            muon = " or --muon_learning_rate" if self.args.optimizer.muon else ""
            raise RunFailed(
                f"training diverged at step {summary['diverged_at_step']} "
                f"({summary['divergence']}) and stopped; {self.output_dir}/{GPT_SUMMARY_FILE} "
                f"records the run as diverged, with no final/ model; lower --learning_rate{muon} "
                "or lengthen --warmup_steps, and start a new run"
            )

    def nothing_to_resume(self, finished: dict[str, Any], is_main: bool) -> int:
        """Resuming a finished run: 0, or RunFailed again if it diverged; the folder stays as is."""
        if finished["verdict"] == "diverged":
            raise RunFailed(
                f"the run in {self.output_dir} diverged at step "
                f"{finished.get('diverged_at_step')} and cannot be resumed; start a new run in "
                "another --output_dir"
            )
        if is_main:
            print(
                f"run folder {self.output_dir} holds a finished run ({headline(finished)}); "
                "nothing to do"
            )
        return 0


def command(loop: type[RunShell]) -> Callable[..., int]:
    """The `main(argv)` of a loop's script (`common.cli.entry_point`)."""
    return entry_point(lambda argv=None: loop(argv).run())
