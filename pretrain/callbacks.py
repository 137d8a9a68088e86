"""Trainer callbacks: speed and GPU readings to TensorBoard, and a checkpoint on SIGTERM/SIGUSR1.

Both hook only into moments where Trainer already synchronises with the device (its logging
steps), so they add no stall to the steps in between.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback

from common.gpu import GpuSampler, write_nvidia_smi_snapshot

logger = logging.getLogger(__name__)

CHECKPOINT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class ThroughputCallback(TrainerCallback):
    """Tokens/s and MFU over each logging window, plus NVML readings, as TensorBoard scalars.

    Also times the training loop as a whole (`loop_seconds`, steps `start_step..end_step`)
    and its first step (`first_step_seconds`: compilation happens there), and takes one
    `nvidia-smi` snapshot halfway through.
    """

    def __init__(
        self,
        tensorboard: TensorBoardCallback | None,
        global_batch_tokens: int,
        flops_per_token: float,
        peak_flops_per_second: float | None,
        num_devices: int,
        snapshot_path: Path,
    ) -> None:
        self.tensorboard = tensorboard
        self.global_batch_tokens = global_batch_tokens
        self.flops_per_token = flops_per_token
        # The whole job's peak: every device runs the same model on its own share of the batch.
        self.peak_flops_per_second = (
            peak_flops_per_second * num_devices if peak_flops_per_second else None
        )
        self.snapshot_path = snapshot_path
        self.gpu_sampler = GpuSampler()
        self.snapshot_taken = False
        self.loop_start: float | None = None
        self.loop_seconds: float | None = None
        self.first_step_seconds: float | None = None
        self.start_step = 0
        self.end_step = 0
        self._window_start = 0.0
        self._window_step = 0

    def mfu(self, tokens_per_second: float) -> float | None:
        """Model FLOPs utilisation: achieved training FLOP/s over the devices' peak."""
        if self.peak_flops_per_second is None:
            return None
        return tokens_per_second * self.flops_per_token / self.peak_flops_per_second

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        self.loop_start = self._window_start = time.perf_counter()
        self.start_step = self._window_step = state.global_step

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        if self.first_step_seconds is None and self.loop_start is not None:
            self.first_step_seconds = time.perf_counter() - self.loop_start

    def on_log(self, args, state: TrainerState, control: TrainerControl, logs=None, **kwargs):
        if not logs or "loss" not in logs or state.global_step <= self._window_step:
            return  # evaluation or end-of-training summaries, or nothing new
        now = time.perf_counter()
        steps = state.global_step - self._window_step
        tokens_per_second = steps * self.global_batch_tokens / (now - self._window_start)
        self._window_start, self._window_step = now, state.global_step
        if not state.is_world_process_zero:
            return
        scalars = {"perf/tokens_per_second": tokens_per_second, **self.gpu_sampler.read()}
        mfu = self.mfu(tokens_per_second)
        if mfu is not None:
            scalars["perf/mfu"] = mfu
        writer = self.tensorboard.tb_writer if self.tensorboard else None
        if writer is not None:
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, state.global_step)
        if not self.snapshot_taken and state.global_step >= state.max_steps // 2:
            self.snapshot_taken = True
            write_nvidia_smi_snapshot(self.snapshot_path)

    def on_train_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        if self.loop_start is not None:
            self.loop_seconds = time.perf_counter() - self.loop_start
        self.end_step = state.global_step


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
