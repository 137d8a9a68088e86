"""`run_summary.json`: what a pretraining run achieved, how fast, on what, with which settings;
every key in `run_summary()`, from `RunPlan` (decided before the first step), `RunSetup` (the
model as built) and `LoopResult` (measured by the loop). Its version and the keys the report
relies on: `common.run_contract`.
"""

import contextlib
import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object

from common.run_contract import GPT_SUMMARY_VERSION, TIME_SUMMARY
from common.system import hardware_description, library_versions
from pretrain.metrics import Span, TimeBudget, model_flops_utilization, tokens_per_second
from pretrain.parallel.strategy import Strategy
from pretrain.plan import RunPlan, RunSetup


@dataclass(frozen=True)
class LoopResult:
    """What the training loop measured; after a resume, timings cover this session only. A
    loop's `measure` gives the first five; the run's shell (pretrain/shell.py) the rest."""

    global_step: int
    logged_losses: list[float]  # training loss of each logging window, the whole run's
    eval_loss: float | None
    replica_checksums: list[str] | None  # one per process; None when parameters are sharded
    # What a strategy verifies about itself (the pipeline: its two copies of the tied weight).
    checks: dict[str, float] = field(default_factory=dict)
    start_step: int = 0  # 0, or the step of the checkpoint this session resumed from
    loop_seconds: float | None = None  # this session's loop, first step included
    first_step_seconds: float | None = None  # carries torch.compile's work and the warm-up
    ranks: list[dict[str, Any]] = field(default_factory=list)  # metrics.rank_footprint's
    # Where the loss, the gradient or the weights became NaN or infinite, what was seen there.
    diverged_at_step: int | None = None
    divergence: str | None = None
    # Where the wall seconds went (laps up to the evaluation), and each checkpoint save.
    budget: TimeBudget | None = None
    checkpoint_saves: list[dict[str, float]] = field(default_factory=list)
    # The parallelism in force (checked against what the launch set up), the processes' state.
    strategy: Strategy | None = None
    accelerator_state: str = ""


def run_summary(plan: RunPlan, setup: RunSetup, result: LoopResult) -> dict[str, Any]:
    """The content of run_summary.json."""
    budget = result.budget
    budget.lap(TIME_SUMMARY)
    wall_seconds = time.time() - budget.launched_at
    schedule = plan.schedule
    session_tokens = schedule.tokens_between(result.start_step, result.global_step)
    speed = tokens_per_second(Span.WHOLE_LOOP, session_tokens, result.loop_seconds)
    diverged = result.diverged_at_step is not None
    final_loss, window = final_training_loss(result.logged_losses, plan.final_loss_window)
    if diverged:
        final_loss = None  # the logged losses of a diverged run are NaN, or hide it as 0
    passed = final_loss is not None and final_loss < plan.loss_threshold
    peak_memory = max(result.ranks, key=lambda rank: rank["peak_memory_bytes"])
    checksums = result.replica_checksums
    save_seconds = sum(save["seconds"] for save in result.checkpoint_saves)
    return {
        "summary_version": GPT_SUMMARY_VERSION,
        # Time and speed of this session.
        "wall_seconds": wall_seconds,  # from the process launch, imports included
        "time_budget": budget.seconds(wall_seconds, result.first_step_seconds, save_seconds),
        "checkpoint_saves": result.checkpoint_saves,
        "compile": budget.compile_counts() if setup.speed_settings.get("compile") else None,
        "train_loop_seconds": result.loop_seconds,
        "first_step_seconds": result.first_step_seconds,
        "tokens_per_second": speed,
        "mfu": model_flops_utilization(speed, setup.flops_per_token, setup.peak_flops_per_second),
        "peak_memory_gib": peak_memory["peak_memory_bytes"] / 2**30,  # the fullest process
        "peak_memory_source": peak_memory["peak_memory_source"],
        # Where the whole run ended, and the verdict.
        "global_step": result.global_step,
        "tokens_trained": schedule.tokens_seen(result.global_step),
        "token_budget": plan.token_budget,
        "final_loss": final_loss,
        "final_loss_window": window,
        "loss_threshold": plan.loss_threshold,
        # The prediction this run tests (the course config's), beside what it measured.
        "expected_final_loss": plan.expected_final_loss,
        # The one verdict: pass (final loss below the threshold), fail, or diverged.
        "verdict": "diverged" if diverged else "pass" if passed else "fail",
        "diverged_at_step": result.diverged_at_step,
        "divergence": result.divergence,
        "eval_loss": result.eval_loss,
        "perplexity": perplexity(result.eval_loss),
        "bits_per_byte": bits_per_byte(result.eval_loss, plan.data["splits"]["validation"]),
        "replica_checksums": checksums,
        "replicas_in_sync": None if checksums is None else len(set(checksums)) == 1,
        # The plan: steps, batch and data.
        "max_steps": schedule.max_steps,
        "global_batch_tokens": schedule.batch_tokens,
        "resumed_from_step": result.start_step,
        "skipped_checkpoints": plan.skipped_checkpoints,
        "run_identity": plan.run_identity,
        "data": plan.data,
        # What was trained, where, and with which settings.
        "num_parameters": setup.num_parameters,
        "flops_per_token": setup.flops_per_token,
        "num_processes": result.strategy.num_processes,
        "accelerator_state": result.accelerator_state,
        "speed_settings": setup.speed_settings,
        "config": setup.config,
        "parallelism": {
            "strategy": result.strategy.name,
            "distributed_type": result.strategy.distributed_type,
            "num_processes": result.strategy.num_processes,
            "ranks": result.ranks,
            **result.checks,
        },
        "hardware": hardware_description(),
        "versions": library_versions(),
    }


def headline(summary: dict[str, Any]) -> str:
    """The result in one line: final loss vs. threshold, eval loss, tokens, speed, time budget."""
    if summary["verdict"] == "diverged":
        return (
            f"DIVERGED at step {summary['diverged_at_step']} ({summary['divergence']}): no "
            f"final loss to hold against {summary['loss_threshold']:g}"
        )
    verdict = "below" if summary["verdict"] == "pass" else "NOT below"
    tokens = f"{summary['tokens_trained']:,} tokens"
    budget = summary.get("token_budget")
    if budget and budget < summary["tokens_trained"]:
        tokens += f" (the budget {budget:,}, rounded up)"
    elif budget and budget > summary["tokens_trained"]:
        tokens += f" (of the budget {budget:,})"
    verdict += f" {summary['loss_threshold']:g}"
    if expected := summary.get("expected_final_loss"):
        verdict += f"; predicted {expected[0]:.2f} +- {expected[1]:.2f}"
    line = (
        f"final loss {_rounded(summary['final_loss'])} ({verdict}), "
        f"eval loss {_rounded(summary['eval_loss'])} "
        f"({_rounded(summary.get('bits_per_byte'))} bits/byte), {tokens}, "
        f"{summary['tokens_per_second'] or 0:,.0f} tokens/s"
    )
    if seconds := summary.get("time_budget"):
        parts = ", ".join(
            f"{name.replace('_', ' ')} {value:.1f}" for name, value in seconds.items()
        )
        line += f"; {summary['wall_seconds']:.1f} s: {parts}"
    return line


def _rounded(loss: float | None) -> str:
    return "n/a" if loss is None else f"{loss:.3f}"


def final_training_loss(logged_losses: list[float], window: int) -> tuple[float | None, int]:
    """Mean of the last `window` logged training losses, and how many there were (Trainer's
    `train_loss` is the whole run's mean, dominated by the first steps)."""
    last = logged_losses[-window:]
    return (sum(last) / len(last) if last else None), len(last)


def perplexity(loss: float | None) -> float | None:
    """exp(loss), None when there is no loss or it overflows."""
    if loss is not None:
        with contextlib.suppress(OverflowError):
            return math.exp(loss)
    return None


def bits_per_byte(loss: float | None, validation: dict[str, Any]) -> float | None:
    """A validation loss in nats per token as bits per byte of the text it predicts, which
    compares runs with other tokenizers (pretrain/blocks/packing.py counts both)."""
    if loss is None or not validation["num_evaluated_bytes"]:
        return None
    return loss * tokens_per_byte(validation) / math.log(2)


def tokens_per_byte(validation: dict[str, Any]) -> float:
    """Predicted tokens per UTF-8 byte of the text they stand for, from a split's stats."""
    return validation["num_evaluated_tokens"] / validation["num_evaluated_bytes"]


def replica_checksums(model: torch.nn.Module, sharded: bool) -> list[str] | None:
    """Every process's SHA-256 of its parameters (all equal iff the replicas are in sync), on
    every process; None when they are `sharded`: they differ between processes by design."""
    if sharded:
        return None
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(name.encode())
        digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return gather_object([digest.hexdigest()])
