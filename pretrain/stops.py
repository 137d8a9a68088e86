"""Stopping a pretraining run, in one place: which signals stop it, what each stage does with
one, and how long the launcher waits.

SIGTERM, SIGUSR1 (Slurm's warning, `scancel`, preemption) and SIGINT (Ctrl-C) are one stop.
Before the training loop the run unwinds at once (`StopRequested`) and leaves no run folder it
made; while the blocks are built the process ends with 128 + signal and keeps nothing (the
blocks' cache); inside the loop `CheckpointOnSignalCallback` saves a checkpoint at the next
logging step, every rank at the same one, and the run ends with 128 + signal; after the last
step the run finishes. launch-pretraining (pretrain/launch.py) passes a stop on to its processes
and kills those still running `STOP_GRACE_VARIABLE` seconds later; a process it started stops
when it dies (`stop_with_launcher`).
"""

import ctypes
import functools
import logging
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState

from common.cli import InputError

logger = logging.getLogger(__name__)

# The signals on which a training run saves a checkpoint and stops (exit code 128 + signal), and
# the seconds launch-pretraining waits for that after passing one on, before it kills them.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
STOP_GRACE_VARIABLE = "PRETRAIN_STOP_GRACE_SECONDS"
MAX_STOP_GRACE_SECONDS = 86400  # a day; Slurm's --signal lead time is at most 65535 s
# launch-pretraining's pid, which the processes it starts watch (`stop_with_launcher`).
LAUNCHER_PID_VARIABLE = "PRETRAIN_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stop_grace_seconds() -> float:
    """STOP_GRACE_VARIABLE's seconds, infinite when it is not set (no launcher kills the run);
    InputError unless it is a number of seconds above 0 and at most a day."""
    text = os.environ.get(STOP_GRACE_VARIABLE)
    if text is None:
        return math.inf
    grace = float(text) if re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*", text) else 0
    if not 0 < grace <= MAX_STOP_GRACE_SECONDS:
        raise InputError(
            f"{STOP_GRACE_VARIABLE}={text!r} is not a number of seconds above 0 and at most "
            f"{MAX_STOP_GRACE_SECONDS}; set it to the seconds a checkpoint save may take after "
            "a stop signal (default 60)"
        )
    return grace


def stop_with_launcher() -> None:
    """A process that launch-pretraining started gets SIGTERM (a stop: a checkpoint, then its
    end) when the launcher dies, even by SIGKILL, which leaves no launcher to pass a signal
    on: the kernel sends it (Linux's PR_SET_PDEATHSIG, through libc's public prctl)."""
    launcher = os.environ.get(LAUNCHER_PID_VARIABLE)
    if launcher is None or os.getppid() != int(launcher) or not sys.platform.startswith("linux"):
        return  # not started by the launcher itself (plain python, or a worker's own child)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(launcher):  # the launcher died before the call
        os.kill(os.getpid(), signal.SIGTERM)


@contextmanager
def signals_handled(signals: tuple[signal.Signals, ...], handler: Callable) -> Iterator[bool]:
    """While the block runs, `handler` handles `signals`; yields whether it does (main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield True
    finally:
        for sig, earlier in previous.items():
            signal.signal(sig, earlier)


def stop_on_termination(signum: int, frame) -> None:
    """SIGTERM and SIGUSR1 (Slurm's warning before the time limit) while the blocks are built
    end the process with exit code 128 + signal, through the unfinished folder's clean-up."""
    logger.warning(
        "stopped by %s while preparing blocks; nothing was kept", signal.Signals(signum).name
    )
    raise SystemExit(128 + signum)


class StopRequested(BaseException):
    """SIGTERM or SIGUSR1 before the training loop: the run unwinds at once; a BaseException,
    so that no handler of ordinary errors keeps going."""

    def __init__(self, received: signal.Signals) -> None:
        super().__init__(received.name)
        self.received = received


def leave_stops_to_trainer(worker_init_fn: Callable[[int], None] | None, worker_id: int) -> None:
    """A DataLoader worker leaves SIGTERM and SIGUSR1 sent to its process group (scancel) to the
    trainer: torch's handler would kill it on SIGTERM, and SIGUSR1 run the trainer's in it. It
    was forked with them blocked (`StopsHeldFromWorkers`): one that came meanwhile is dropped."""
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


class StopsHeldFromWorkers:
    """While the training loop runs, SIGTERM and SIGUSR1 are blocked in the main thread, so
    that a DataLoader worker forked from it inherits them blocked: between its fork and its
    init function (`leave_stops_to_trainer`) torch's own handler would let SIGTERM kill it, and
    its rank fail the run. This process still takes them, through a thread that leaves them
    unblocked (Python then runs the handler in the main thread)."""

    def __init__(self) -> None:
        self.receiver: threading.Thread | None = None
        self.done = threading.Event()

    def hold(self) -> None:
        if threading.current_thread() is threading.main_thread() and self.receiver is None:
            self.receiver = threading.Thread(target=self.done.wait, daemon=True)
            self.receiver.start()
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def release(self) -> None:
        if self.receiver is not None:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            self.done.set()
            self.receiver.join()
            self.receiver = None


class CheckpointOnSignalCallback(TrainerCallback):
    """A stop while `caught()` lasts, as the module says. Only at a logging step: every rank
    stops at the same one (they agree by an all-reduce), and the checkpoint's log holds every
    step's loss, so a resumed run logs the uninterrupted run's windows (a window split by the
    stop made the final loss differ, 7.209 for 7.213)."""

    received: signal.Signals | None = None
    stopped_at_step: int | None = None
    _loop = "before"  # "before", "running" or "done"

    def __init__(self) -> None:
        self.workers = StopsHeldFromWorkers()

    @contextmanager
    def caught(self) -> Iterator[None]:
        with signals_handled(STOP_SIGNALS, self._handle) as handled:
            if not handled:
                logger.warning("not in the main thread: no checkpoint on SIGTERM/SIGUSR1")
            try:
                yield
            finally:
                self.workers.release()

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:  # again: Ctrl-C reaches a process and its launcher, which
            return  # passes it on; a second StopRequested would cut the first one's clean-up short
        self.received = received = signal.Signals(signum)
        if self._loop == "before":
            raise StopRequested(received)
        ending = "the last step is done; finishing the run"
        if self._loop == "running":
            ending = "saving a checkpoint at the next logging step"
        logger.warning("received %s: %s", received.name, ending)

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        self._loop = "running"
        # The workers start later, with the loop's first batch; accelerate's loader wraps torch's.
        loader = getattr(kwargs["train_dataloader"], "base_dataloader", kwargs["train_dataloader"])
        loader.worker_init_fn = functools.partial(leave_stops_to_trainer, loader.worker_init_fn)
        self.workers.hold()

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        if state.global_step % max(state.logging_steps, 1) != 0:  # Trainer's interval
            return
        received = self.received
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            signum = torch.tensor([int(received or 0)], device=args.device)
            dist.all_reduce(signum, op=dist.ReduceOp.MAX)  # 0: no process received one
            received = signal.Signals(int(signum.item())) if signum.item() else None
            # One that came during the all-reduce is kept for the next step's: the processes
            # agreed without it (it was lost, and the run trained on until it was killed).
            self.received = self.received or received
        if received is not None and state.global_step < state.max_steps:
            self.stopped_at_step = state.global_step
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        self._loop = "done"
        self.workers.release()
