"""Train one variant of a benchmark as a process group of its own (a launcher and its workers,
stopped together), its output in `<run_dir>.log`, with a time limit; read back the
run_summary.json it wrote, or say in one line why there is none. With `read_back`, a finished
variant whose log starts with the same flags is read back instead of trained again.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.cli import InputError
from common.run_contract import GPT_SUMMARY_FILE, GPT_SUMMARY_VERSION, read_gpt_summary

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class VariantOutcome:
    """A variant's run summary, or why there is none, and how long it took here."""

    summary: dict[str, Any] | None
    error: str | None
    wall_seconds: float


def repo_environment(**overrides: str) -> dict[str, str]:
    """This process's environment with the repository importable, plus `overrides`."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **overrides}


def log_path(run_dir: Path) -> Path:
    return Path(f"{run_dir}.log")


def finished_earlier(command: list[str], run_dir: Path) -> dict[str, Any] | None:
    """The summary of a run of the same flags (`command[2:]`) in `run_dir`, else None."""
    summary_path, log = run_dir / GPT_SUMMARY_FILE, log_path(run_dir)
    if not summary_path.is_file() or not log.is_file():
        return None
    with log.open(encoding="utf-8") as lines:
        if shlex.split(lines.readline())[2:] != command[2:]:
            return None
    try:  # one that is not strict JSON, or of another version, is trained again
        summary = read_gpt_summary(summary_path, note=lambda _: None)
    except InputError:
        return None
    return summary if summary.get("summary_version") == GPT_SUMMARY_VERSION else None


def run_variant(
    command: list[str],
    run_dir: Path,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    read_back: bool = False,
) -> VariantOutcome:
    """Run `command`, which trains into `run_dir` (replaced); its summary or its error."""
    started = time.perf_counter()
    if read_back and (summary := finished_earlier(command, run_dir)) is not None:
        return VariantOutcome(summary, None, 0.0)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    summary, error = None, None
    # The launcher and its workers form one process group, stopped together on a timeout or an
    # interrupt: killing the launcher alone would leave its workers training.
    with log_path(run_dir).open("w", encoding="utf-8") as log:
        log.write(shlex.join(command) + "\n")
        log.flush()
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            if process.poll() is None:  # the time limit, or an interrupt
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    summary_path = run_dir / GPT_SUMMARY_FILE
    if returncode is None:
        error = f"stopped at its time limit ({timeout_s:.0f} s)"
    elif returncode != 0:
        error = f"exit code {returncode}: {error_line(log_path(run_dir).read_text('utf-8'))}"
    elif not summary_path.is_file():
        error = f"exited with 0 but wrote no {summary_path.name}"
    else:
        try:
            summary = read_gpt_summary(summary_path)
        except InputError as err:  # a summary that is not strict JSON, or of a newer version
            error = str(err)
    return VariantOutcome(summary, error, time.perf_counter() - started)


# The launchers' own closing words when a worker failed: they say that, not why.
LAUNCHER_FAILURES = ("CalledProcessError", "ChildFailedError")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")


def error_line(log_text: str) -> str:
    """Why a variant failed, in one line: our `error:` line, else the last exception that is
    not the launcher's, else the log's last line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("error:")]
    raised = [line for line in lines if EXCEPTION_LINE.match(line)]
    raised = [line for line in raised if not line.startswith(LAUNCHER_FAILURES)]
    return (ours or raised or lines or ["no output"])[-1]
