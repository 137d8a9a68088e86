"""`accelerate launch` for pretraining, ending with an exit code that says how the run ended.

    launch-pretraining --config_file accelerate_configs/cpu_ddp.yaml --num_processes 2 \\
        pretrain/run.py --config pretrain/configs/tiny.yaml

Same arguments, same launchers. Exits 0 when done; 143 / 138 / 130 when SIGTERM / SIGUSR1 / SIGINT
(passed on to the processes, killed if still running PRETRAIN_STOP_GRACE_SECONDS, 60, later) left
a saved checkpoint; 2 / 3 for bad input / a failed run, in one `error:` line (ours names a killed
process, or a stop that saved nothing); any other code is a crash, with its traceback.
"""

import argparse
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import NoReturn

import psutil
from accelerate.commands.launch import launch_command, launch_command_parser
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from transformers.trainer_utils import sort_checkpoints

from common import cli
from common.files import read_manifest
from common.run_contract import PEER_STOPPED
from pretrain.device import mark_gpu_required
from pretrain.stops import (
    LAUNCHER_PID_VARIABLE,
    STOP_GRACE_VARIABLE,
    STOP_SIGNALS,
    stop_grace_seconds,
)

ERRORS_LOG = "process_errors.log"  # in the run folder: what follows from our error line
# A process's error line, and its traceback once in a process group (torch puts the rank first).
HELD_LINE = re.compile(rb"error: |\[rank\d+\]: ")


def run_folder(script_args: list[str]) -> Path | None:
    """The training's `--output_dir`: from its command line, else from its `--config` file."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--output_dir")
    output_dir = parser.parse_known_args(script_args)[0].output_dir
    if output_dir is None and (config := cli.config_path(script_args)) is not None:
        with contextlib.suppress(cli.InputError):  # the training process says so itself
            output_dir = cli.load_config_file(config).get("output_dir")
    return Path(output_dir) if output_dir else None


def newest_complete_checkpoint(run_dir: Path | None) -> Path | None:
    """The newest `checkpoint-<step>/` that is complete: its manifest, written last, reads."""
    if run_dir is None:
        return None
    newest_first = (Path(path) for path in reversed(sort_checkpoints(str(run_dir))))
    return next((path for path in newest_first if read_manifest(path) is not None), None)


class StopSignals:
    """Pass the first stop signal (SIGTERM, SIGUSR1, SIGINT) on to the processes and kill those
    still running `grace` seconds later: the job's end would kill them anyway, at no known time."""

    def __init__(self, grace: float, run_dir: Path | None) -> None:
        self.run_dir, self.received, self.checkpoint_before = run_dir, None, None
        self.timer = threading.Timer(grace, self._send, args=(signal.SIGKILL,))
        for stop_signal in STOP_SIGNALS:
            signal.signal(stop_signal, self._pass_on)

    def _pass_on(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
            self.checkpoint_before = newest_complete_checkpoint(self.run_dir)
            self._send(signum)
            self.timer.start()

    def _send(self, signum: int) -> None:
        self.grace_ended = signum == signal.SIGKILL  # the last signal sent: the stop, or the kill
        for process in psutil.Process().children():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signum)


class HeldErrors:
    """Pass what the processes write to stderr on to the terminal as it comes, except their error
    lines and tracebacks: those wait until it is known whether they explain the end or follow
    from it (a peer's failed all-reduce after a process was killed)."""

    def __init__(self) -> None:
        self.terminal = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)  # inherited by every process started from here on
        os.close(write_end)
        self.held: list[bytes] = []
        self.thread = threading.Thread(target=self._pass_on, args=(read_end,), daemon=True)
        self.thread.start()

    def _pass_on(self, read_end: int) -> None:
        rest = b""
        while chunk := os.read(read_end, 1 << 16):
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                self._sort(line + b"\n")
            if b"\r" in rest:  # a progress bar redrawing its line: show it now
                self._sort(rest)
                rest = b""
        self._sort(rest)

    def _sort(self, text: bytes) -> None:
        if HELD_LINE.match(text):
            self.held.append(text)
        else:
            os.write(self.terminal, text)

    def close(self) -> bytes:
        """Give stderr back to the terminal; the held lines once the processes ended."""
        os.dup2(self.terminal, 2)
        self.thread.join(timeout=5)
        return b"".join(dict.fromkeys(self.held))  # N processes refusing one input: one line


def outcome(codes: dict[int, int], stop: StopSignals) -> tuple[int, str | None]:
    """The exit code, and the `error:` line when the processes could not say it themselves.
    `codes`: the failed processes' by rank, the first to fail (the others' cause) first."""
    if not codes:
        return 0, None
    checkpoint = newest_complete_checkpoint(stop.run_dir)
    newest = f"the newest complete checkpoint is {checkpoint or 'none'}"
    if stop.received is not None:
        # Only a new complete checkpoint makes it a stop to resume from: a process that stops
        # before its first step exits 128 + signal too, and requeueing it would repeat that.
        if checkpoint != stop.checkpoint_before:
            return 128 + stop.received, None
        why = "it came before training began (or the loop saves no checkpoints: TP, PP)"
        if stop.grace_ended:
            grace = f"{stop.timer.interval:g} s ({STOP_GRACE_VARIABLE})"
            why = f"the processes were killed after {grace}"
        return cli.EXIT_RUN_FAILED, f"{stop.received.name} stopped the run unsaved: {why}; {newest}"
    rank, code = next(iter(codes.items()))
    if code >= 0:
        return code, None
    return cli.EXIT_RUN_FAILED, (
        f"rank {rank} was killed by {signal.Signals(-code).name} (out of memory, or from "
        f"outside) and the run stopped; {newest}; continue with --resume_from_checkpoint auto"
    )


def parse_launch_args(argv: list[str] | None) -> argparse.Namespace:
    """accelerate launch's options; a mistake is one line, not accelerate's 112-line usage."""
    parser = launch_command_parser()

    def refuse(message: str) -> NoReturn:
        raise cli.InputError(f"{message} (launch-pretraining --help lists the launcher's options)")

    parser.error = refuse  # argparse's documented hook for how errors end
    return parser.parse_args(argv)


@cli.entry_point
def main(argv: list[str] | None = None) -> int:
    args = parse_launch_args(argv)
    args.quiet = False  # with it, accelerate ends with exit code 1 instead of the process's
    run_dir = run_folder(args.training_script_args)
    mark_gpu_required(args)
    os.environ.setdefault(STOP_GRACE_VARIABLE, "60")  # the processes warn against it too
    os.environ[LAUNCHER_PID_VARIABLE] = str(os.getpid())  # they stop when it dies
    stop = StopSignals(stop_grace_seconds(), run_dir)
    os.environ["PET_SIGNALS_TO_HANDLE"] = "SIGHUP,SIGQUIT"  # SIGTERM, SIGUSR1, SIGINT: ours
    # torchrun's lines on a failure ("Sending process ... closing signal") say less than ours;
    # accelerate lists the launch defaults it filled in (threads per CPU process) on every start.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    logging.getLogger("accelerate.commands.launch").setLevel(logging.ERROR)
    stderr = HeldErrors()
    codes: dict[int, int] = {}
    try:
        launch_command(args)
    except subprocess.CalledProcessError as err:  # one process
        codes = {0: err.returncode}
    except ChildFailedError as err:  # in the order torchrun saw them fail
        failures = sorted(err.failures.items(), key=lambda item: item[1].timestamp)
        codes = {rank: failure.exitcode for rank, failure in failures}
    except SignalException as err:  # SIGHUP, SIGQUIT
        codes = {0: 128 + err.sigval}
    finally:
        stop.timer.cancel()
        held = stderr.close()
    code, message = outcome(codes, stop)
    if held and message and run_dir is not None and run_dir.is_dir():  # they follow from it
        (run_dir / ERRORS_LOG).write_bytes(held)
        message += f"; the processes' own error lines and tracebacks: {run_dir / ERRORS_LOG}"
    elif held:  # no line of ours: theirs explain the end, a peer's end no cause of its own
        causes = [line for line in held.splitlines(True) if PEER_STOPPED.encode() not in line]
        os.write(2, b"".join(causes) or held)
    if message:
        raise cli.RunFailed(message)
    return code


if __name__ == "__main__":
    sys.exit(main())
