"""`run_summary.json`: what a pretraining run achieved, how fast, on what, with which settings.

The summary is made of parts, each filled by the step of `pretrain/run.py` that knows its
numbers: `PlanRecord` by the plan (steps, batch, data), `SetupRecord` by the trainer set-up
(model, processes, speed settings), `LoopRecord` by `ThroughputCallback` (the training loop's
time and speed), `OutcomeRecord` at the end (losses, replicas) and `ParallelismRecord` (the
strategy in force and what each process held) from every process. `RunSummary.to_dict()` is
the file's content; its version and the keys the report relies on are in
`common.run_contract`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import Trainer

from common.files import write_json_atomic
from common.run_contract import GPT_SUMMARY_VERSION
from common.system import hardware_description, library_versions


@dataclass(frozen=True)
class PlanRecord:
    """Decided before training: how many steps, how big a batch, on which data."""

    max_steps: int
    global_batch_tokens: int
    resumed_from_step: int
    data: dict[str, Any]  # the packed-block cache folder and its stats.json


@dataclass(frozen=True)
class SetupRecord:
    """What was built: the model, the processes that train it, the settings that decide speed."""

    num_parameters: int
    flops_per_token: float
    num_processes: int
    accelerator_state: str
    speed_settings: dict[str, Any]
    config: dict[str, Any]  # every resolved argument dataclass, the model config, precision


@dataclass(frozen=True)
class LoopRecord:
    """This process's training loop; after a resume, the steps since the checkpoint."""

    train_loop_seconds: float | None
    first_step_seconds: float | None  # carries torch.compile's work and CUDA's warm-up
    peak_memory_gib: float | None
    tokens_per_second: float | None
    mfu: float | None


@dataclass(frozen=True)
class OutcomeRecord:
    """Where the whole run ended (across resumes): steps, tokens, losses, replica agreement."""

    global_step: int
    tokens_trained: int
    final_loss: float | None
    final_loss_window: int
    loss_threshold: float
    eval_loss: float | None
    # Validation tokens per byte of validation text (the packed blocks' stats): turns the loss
    # per token, which depends on the vocabulary, into one per byte, which does not.
    validation_tokens_per_byte: float | None
    replica_checksums: list[str] | None  # one per process; None when parameters are sharded

    @property
    def loss_below_threshold(self) -> bool:
        return self.final_loss is not None and self.final_loss < self.loss_threshold

    @property
    def perplexity(self) -> float | None:
        return perplexity(self.eval_loss)

    @property
    def bits_per_byte(self) -> float | None:
        return bits_per_byte(self.eval_loss, self.validation_tokens_per_byte)

    @property
    def replicas_in_sync(self) -> bool | None:
        if self.replica_checksums is None:
            return None
        return len(set(self.replica_checksums)) == 1


@dataclass(frozen=True)
class ParallelismRecord:
    """How the model was spread over the processes, and what each of them held at the end."""

    strategy: str  # pretrain.strategy.Strategy.name: "single", "ddp", "fsdp2", "zero2", ...
    distributed_type: str  # accelerate's, as checked against the request before training
    num_processes: int
    ranks: list[dict[str, Any]]  # pretrain.footprint records, in rank order


@dataclass(frozen=True)
class RunSummary:
    wall_seconds: float  # from the process launch to the summary
    plan: PlanRecord
    setup: SetupRecord
    loop: LoopRecord
    outcome: OutcomeRecord
    parallelism: ParallelismRecord

    def to_dict(self) -> dict[str, Any]:
        """The content of run_summary.json."""
        return {
            "summary_version": GPT_SUMMARY_VERSION,
            "wall_seconds": self.wall_seconds,
            **dataclasses.asdict(self.loop),
            **dataclasses.asdict(self.outcome),
            "loss_below_threshold": self.outcome.loss_below_threshold,
            "perplexity": self.outcome.perplexity,
            "bits_per_byte": self.outcome.bits_per_byte,
            "replicas_in_sync": self.outcome.replicas_in_sync,
            **dataclasses.asdict(self.plan),
            **dataclasses.asdict(self.setup),
            "parallelism": dataclasses.asdict(self.parallelism),
            "hardware": hardware_description(),
            "versions": library_versions(),
        }

    def write(self, path: Path) -> None:
        write_json_atomic(path, self.to_dict())

    def headline(self) -> str:
        """The result in one line: final loss against the threshold, eval loss, speed."""
        outcome = self.outcome
        verdict = "below" if outcome.loss_below_threshold else "NOT below"
        return (
            f"final loss {_rounded(outcome.final_loss)} ({verdict} {outcome.loss_threshold:g}), "
            f"eval loss {_rounded(outcome.eval_loss)} "
            f"({_rounded(outcome.bits_per_byte)} bits/byte), "
            f"{self.loop.tokens_per_second or 0:,.0f} tokens/s"
        )


def _rounded(loss: float | None) -> str:
    return "n/a" if loss is None else f"{loss:.3f}"


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


def bits_per_byte(loss: float | None, tokens_per_byte: float | None) -> float | None:
    """A loss in nats per token as bits per byte of the text: loss x tokens/byte / ln 2."""
    if loss is None or tokens_per_byte is None:
        return None
    return loss * tokens_per_byte / math.log(2)


def replica_checksums(trainer: Trainer) -> list[str] | None:
    """One parameter checksum per process (None when the parameters are sharded)."""
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    return gather_object([parameter_checksum(model)])


def parameter_checksum(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes: equal on all ranks iff the replicas are in sync."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(name.encode())
        digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()
