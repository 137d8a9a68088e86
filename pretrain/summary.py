"""`run_summary.json`: what a pretraining run achieved, how fast, on what, with which settings."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

from common.system import hardware_description, library_versions

SUMMARY_VERSION = 1


def process_start_time() -> float:
    """Unix time at which this process started (Linux), else now: the launch, for wall time."""
    try:
        # Field 22 of /proc/self/stat, counted after the parenthesised command name.
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        running_for = time.clock_gettime(time.CLOCK_BOOTTIME) - started_after_boot
        return time.time() - running_for
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def final_training_loss(log_history: list[dict[str, Any]], window: int) -> tuple[float | None, int]:
    """Mean of the last `window` logged training losses, and how many there were.

    Trainer's own `train_loss` is the mean over the whole run, dominated by the first steps;
    the course judges the loss the model has at the end.
    """
    losses = [entry["loss"] for entry in log_history if "loss" in entry]
    last = losses[-window:]
    if not last:
        return None, 0
    return sum(last) / len(last), len(last)


def perplexity(loss: float | None) -> float | None:
    """exp(loss), None when there is no loss or it overflows."""
    if loss is None:
        return None
    try:
        return math.exp(loss)
    except OverflowError:
        return None


def config_as_dict(*argument_objects: Any) -> dict[str, dict[str, Any]]:
    """Every resolved argument dataclass, keyed by its class name."""
    resolved = {}
    for arguments in argument_objects:
        if hasattr(arguments, "to_dict"):  # TrainingArguments: enums as strings, secrets hidden
            values = arguments.to_dict()
        else:
            values = dataclasses.asdict(arguments)
        resolved[type(arguments).__name__] = values
    return resolved


def build_run_summary(
    *,
    wall_seconds: float,
    train_loop_seconds: float | None,
    tokens_trained: int,
    session_tokens: int,
    mfu: float | None,
    final_loss: float | None,
    final_loss_window: int,
    loss_threshold: float,
    eval_loss: float | None,
    max_steps: int,
    global_step: int,
    resumed_from_step: int,
    global_batch_tokens: int,
    num_parameters: int,
    flops_per_token: float,
    accelerator_state: str,
    num_processes: int,
    replica_checksums: list[str] | None,
    config: dict[str, Any],
    data: dict[str, Any],
    speed_settings: dict[str, Any],
    first_step_seconds: float | None = None,
    peak_memory_gib: float | None = None,
) -> dict[str, Any]:
    """The summary dict; times and speed cover this process's session (after a resume, the
    steps since the checkpoint), losses and tokens the whole run."""
    tokens_per_second = (
        session_tokens / train_loop_seconds if train_loop_seconds and session_tokens else None
    )
    return {
        "summary_version": SUMMARY_VERSION,
        "wall_seconds": wall_seconds,
        "train_loop_seconds": train_loop_seconds,
        # The first step carries torch.compile's work and CUDA's warm-up.
        "first_step_seconds": first_step_seconds,
        "peak_memory_gib": peak_memory_gib,
        "tokens_trained": tokens_trained,
        "tokens_per_second": tokens_per_second,
        "mfu": mfu,
        "final_loss": final_loss,
        "final_loss_window": final_loss_window,
        "loss_threshold": loss_threshold,
        "loss_below_threshold": final_loss is not None and final_loss < loss_threshold,
        "eval_loss": eval_loss,
        "perplexity": perplexity(eval_loss),
        "max_steps": max_steps,
        "global_step": global_step,
        "resumed_from_step": resumed_from_step,
        "global_batch_tokens": global_batch_tokens,
        "num_parameters": num_parameters,
        "flops_per_token": flops_per_token,
        "num_processes": num_processes,
        "replica_checksums": replica_checksums,
        "replicas_in_sync": (
            None if replica_checksums is None else len(set(replica_checksums)) == 1
        ),
        "hardware": hardware_description(),
        "versions": library_versions(),
        "accelerator_state": accelerator_state,
        "config": config,
        "data": data,
        "speed_settings": speed_settings,
    }
