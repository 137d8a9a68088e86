"""Run one training command as a variant of a benchmark and read its run summary back.

Shared by every benchmark that trains several variants side by side (bench/gpu_ablation.py,
bench/compare_parallelism.py): each variant is its own process group (a launcher and its
workers, stopped together), with its output in a log file, a time limit, and the
`run_summary.json` it wrote read back; a variant that fails gives one line saying why.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.run_contract import GPT_SUMMARY_FILE


@dataclass(frozen=True)
class VariantOutcome:
    """A variant's run summary, or why there is none, and how long it took."""

    summary: dict[str, Any] | None
    error: str | None
    wall_seconds: float


def run_variant(
    command: list[str],
    run_dir: Path,
    log_path: Path,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> VariantOutcome:
    """Run `command`, which trains into `run_dir`; its summary or its error."""
    started = time.perf_counter()
    summary, error = None, None
    try:
        returncode = run_logged(command, env, log_path, timeout_s)
    except subprocess.TimeoutExpired:
        error = f"stopped after the time limit of {timeout_s:g} s"
    else:
        summary_path = run_dir / GPT_SUMMARY_FILE
        if returncode != 0:
            error = f"exit code {returncode}: {error_line(log_path.read_text('utf-8'))}"
        elif not summary_path.is_file():
            error = f"exited with 0 but wrote no {summary_path.name}"
        else:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
    return VariantOutcome(summary, error, time.perf_counter() - started)


def run_logged(
    command: list[str], env: dict[str, str] | None, log_path: Path, timeout_s: float | None
) -> int:
    """Run `command` with its output in `log_path`; its exit code. Raises TimeoutExpired after
    `timeout_s`.

    The launcher and its workers form one process group, stopped together on a timeout or an
    interrupt: killing the launcher alone would leave its workers training.
    """
    with log_path.open("w", encoding="utf-8") as log:
        log.write(shlex.join(command) + "\n")
        log.flush()
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            return process.wait(timeout=timeout_s)
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise


# The launchers' own closing words when a worker failed: they say that, not why.
LAUNCHER_FAILURES = ("CalledProcessError", "ChildFailedError")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")


def error_line(log_text: str) -> str:
    """Why a variant failed, in one line: our `error:` line, else the last exception that is
    not the launcher's, else the log's last line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:"):
            return line
    for line in reversed(lines):
        if EXCEPTION_LINE.match(line) and not line.startswith(LAUNCHER_FAILURES):
            return line
    return lines[-1] if lines else "no output"


def steady_step_seconds(summary: dict[str, Any]) -> float | None:
    """Seconds per optimizer step after the first (which carries compilation and warm-up)."""
    first, loop = summary.get("first_step_seconds"), summary.get("train_loop_seconds")
    steps = summary.get("global_step", 0) - summary.get("resumed_from_step", 0)
    if first is None or loop is None or steps < 2 or loop <= first:
        return None
    return (loop - first) / (steps - 1)
