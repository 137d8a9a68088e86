"""Trainer callbacks and TensorBoard plumbing: speed and GPU readings, what each process holds,
a checkpoint on signals.

Both callbacks hook only into moments where Trainer already synchronises with the device (its
logging steps), so they add no stall to the steps in between.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback

from common.run_contract import MFU, TOKENS_PER_SECOND
from pretrain.batches import BlockSchedule
from pretrain.footprint import gather_footprints, local_tensor, rank_footprint
from pretrain.gpu import GpuReadings, write_nvidia_smi_snapshot
from pretrain.model import model_flops_utilization

logger = logging.getLogger(__name__)

CHECKPOINT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class LoopClock:
    """Times a training loop, whichever it is: the whole loop, its first step (compilation
    happens there), and each logging window's tokens/s and MFU with the GPU's readings, as
    TensorBoard scalars; takes one `nvidia-smi` snapshot halfway through.

    The loop calls `start` before its first step, `step_done` after each step, `window` at each
    logging step (where it synchronises with the device anyway), and `stop` after the last.
    """

    def __init__(
        self,
        schedule: BlockSchedule,
        flops_per_token: float,
        peak_flops_per_second: float | None,
        device: torch.device,
        snapshot_path: Path,
    ) -> None:
        self.schedule = schedule
        self.flops_per_token = flops_per_token
        self.peak_flops_per_second = peak_flops_per_second
        self.snapshot_path = snapshot_path
        self.gpu = GpuReadings(device)
        self.snapshot_taken = False
        self.loop_start: float | None = None
        self.loop_seconds: float | None = None
        self.first_step_seconds: float | None = None
        self._window_start = 0.0
        self._window_step = 0

    def start(self, step: int) -> None:
        self.loop_start = self._window_start = time.perf_counter()
        self._window_step = step

    def step_done(self) -> None:
        if self.first_step_seconds is None and self.loop_start is not None:
            self.first_step_seconds = time.perf_counter() - self.loop_start

    def window(self, step: int) -> dict[str, float]:
        """The scalars of the logging window that ends at `step` (empty when nothing new)."""
        if step <= self._window_step:
            return {}
        now = time.perf_counter()
        tokens = self.schedule.tokens_seen(step) - self.schedule.tokens_seen(self._window_step)
        tokens_per_second = tokens / (now - self._window_start)
        self._window_start, self._window_step = now, step
        scalars = {TOKENS_PER_SECOND: tokens_per_second, **self.gpu.read()}
        mfu = model_flops_utilization(
            tokens_per_second, self.flops_per_token, self.peak_flops_per_second
        )
        if mfu is not None:
            scalars[MFU] = mfu
        if not self.snapshot_taken and step >= self.schedule.max_steps // 2:
            self.snapshot_taken = True
            write_nvidia_smi_snapshot(self.snapshot_path)
        return scalars

    def stop(self) -> None:
        if self.loop_start is not None:
            self.loop_seconds = time.perf_counter() - self.loop_start


class ThroughputCallback(TrainerCallback):
    """`LoopClock` in Trainer's loop: its window scalars go to Trainer's TensorBoard writer."""

    def __init__(self, tensorboard: TensorBoardCallback | None, clock: LoopClock) -> None:
        self.tensorboard = tensorboard
        self.clock = clock

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        self.clock.start(state.global_step)

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        self.clock.step_done()

    def on_log(self, args, state: TrainerState, control: TrainerControl, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return  # evaluation or end-of-training summaries
        scalars = self.clock.window(state.global_step)
        writer = self.tensorboard.tb_writer if self.tensorboard else None
        if state.is_world_process_zero and writer is not None:
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, state.global_step)

    def on_train_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        self.clock.stop()


def divergence(readings: dict[str, float | None]) -> str | None:
    """The readings that are NaN or infinite ("loss nan, grad_norm inf"), or None."""
    bad = [
        f"{name} {value}"
        for name, value in readings.items()
        if value is not None and not math.isfinite(value)
    ]
    return ", ".join(bad) or None


class DivergenceCallback(TrainerCallback):
    """Stop a run whose loss or gradient norm became NaN or infinite, at the logging step that
    shows it, and save no checkpoint of the broken weights.

    Both readings are the same on every process (the loss is averaged over them, the gradient
    norm is the whole model's), so all stop at the same step. Under fp16 loss scaling an
    infinite gradient is a skipped step, not a divergence: only the loss counts there.
    """

    def __init__(self) -> None:
        self.diverged_at_step: int | None = None
        self.reading: str | None = None

    def on_log(self, args, state: TrainerState, control: TrainerControl, logs=None, **kwargs):
        if not logs or self.diverged_at_step is not None:
            return
        readings = {"loss": logs.get("loss")}
        if not args.fp16:
            readings["grad_norm"] = logs.get("grad_norm")
        reading = divergence(readings)
        if reading is None:
            return
        self.diverged_at_step, self.reading = state.global_step, reading
        logger.error("training diverged at step %d (%s): stopping", state.global_step, reading)
        control.should_training_stop = True
        control.should_save = False

    def on_train_end(
        self, args, state: TrainerState, control: TrainerControl, model=None, **kwargs
    ):
        # The logs can miss it (NaN steps logged as 0 by --logging_nan_inf_filter, a skipped
        # fp16 step): the weights cannot.
        if self.diverged_at_step is None and not weights_are_finite(model, args.device):
            self.diverged_at_step, self.reading = state.global_step, "weights nan or inf"
            logger.error("the weights are not finite after step %d", state.global_step)


def weights_are_finite(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether every parameter (this process's shard of it) is finite, on all processes."""
    finite = all(torch.isfinite(local_tensor(p)).all() for p in model.parameters())
    flag = torch.tensor([int(finite)], device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


class FootprintCallback(TrainerCallback):
    """Every process's parameter and optimizer-state bytes and peak memory when training ends.

    Measured there, before the final save and the evaluation gather sharded weights: after
    them an FSDP2 process was seen holding two thirds of the model's weights instead of half.
    """

    def __init__(self) -> None:
        self.ranks: list[dict] | None = None

    def on_train_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.ranks = gather_footprints(rank_footprint(model, optimizer, args.device))


class CheckpointOnSignalCallback(TrainerCallback):
    """Save a checkpoint and stop cleanly when SIGTERM or SIGUSR1 arrives.

    Slurm sends the signal chosen with `#SBATCH --signal=USR1@90` before the time limit, and
    SIGTERM on `scancel` or preemption. The handler only sets a flag; at the end of the current
    optimizer step the callback asks Trainer to save and stop. With several processes, every
    rank must stop at the same step (or the others would wait forever in the next all-reduce),
    so the ranks agree through one small all-reduce every `--logging_steps` steps, when Trainer
    synchronises anyway; a single process checks after every step.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = CHECKPOINT_SIGNALS) -> None:
        self.signals = signals
        self.received: signal.Signals | None = None
        self.stopped_at_step: int | None = None
        self._previous_handlers: dict[signal.Signals, object] = {}

    def _handle(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
            logger.warning(
                "received %s: saving a checkpoint at the end of this step", self.received.name
            )

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            logger.warning("not in the main thread: no checkpoint on SIGTERM/SIGUSR1")
            return
        for sig in self.signals:
            self._previous_handlers[sig] = signal.signal(sig, self._handle)

    def _signal_on_any_rank(self, args: TrainingArguments) -> signal.Signals | None:
        signum = torch.tensor([int(self.received or 0)], device=args.device)
        dist.all_reduce(signum, op=dist.ReduceOp.MAX)
        return signal.Signals(int(signum.item())) if signum.item() else None

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            if state.global_step % max(int(args.logging_steps), 1) != 0:
                return
            agreed = self._signal_on_any_rank(args)
            if agreed is None:
                return
            self.received = agreed
        if self.received is not None and state.global_step < state.max_steps:
            self.stopped_at_step = state.global_step
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()


def find_tensorboard_callback(trainer: Trainer) -> TensorBoardCallback | None:
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            return callback
    return None


def continue_tensorboard_log(callback: TensorBoardCallback, log_dir: Path, start_step: int) -> None:
    """Open the event writer so that a resumed run draws one continuous curve.

    Events an interrupted run wrote after its last checkpoint (steps > `start_step`) would
    overlap the resumed run's; `purge_step` makes TensorBoard drop them.
    """
    event_files = list(log_dir.glob("events.out.tfevents.*"))
    if not event_files:
        return
    # TensorBoard reads a folder's event files in name order, and a name starts with the
    # second its writer was created: the new file must not share the last file's second, or
    # it may sort first and the purge would hit nothing.
    newest_second = max(int(path.name.split(".")[3]) for path in event_files)
    while time.time() < newest_second + 1:
        time.sleep(0.05)
    callback.tb_writer = SummaryWriter(log_dir=str(log_dir), purge_step=start_step + 1)
