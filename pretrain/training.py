"""Trainer plumbing for packed blocks: batches, the step count, TensorBoard, replica checks."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils.tensorboard import SummaryWriter
from transformers import Trainer, TrainingArguments
from transformers.integrations import TensorBoardCallback

from common.cli import InputError

logger = logging.getLogger(__name__)


def collate_blocks(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack packed blocks into a batch; the labels are the inputs (the model shifts them).

    No attention mask: every block is full, so attention is the plain causal kernel.
    """
    input_ids = torch.stack([torch.as_tensor(example["input_ids"]) for example in examples])
    input_ids = input_ids.long()  # (batch, block_size); int64 for the embedding and the loss
    return {"input_ids": input_ids, "labels": input_ids}


def global_batch_blocks(training_args: TrainingArguments) -> int:
    """Blocks per optimizer step: processes x per-device batch x gradient accumulation."""
    return (
        training_args.world_size
        * training_args.per_device_train_batch_size
        * training_args.gradient_accumulation_steps
    )


def derive_max_steps(num_train_blocks: int, batch_blocks: int, requested_max_steps: int) -> int:
    """Optimizer steps that show every training block exactly once.

    ceil(blocks / global batch): the last step takes the remainder, so the token budget is
    met exactly (Trainer counts an epoch's steps the same way). A positive
    `requested_max_steps` may stop earlier, e.g. for a quick check, but never later.
    """
    if num_train_blocks < batch_blocks:
        raise InputError(
            f"the training split has {num_train_blocks} blocks, fewer than one global batch of "
            f"{batch_blocks}; raise --max_train_tokens (or use a bigger corpus) or lower "
            "--per_device_train_batch_size / --gradient_accumulation_steps"
        )
    steps = math.ceil(num_train_blocks / batch_blocks)
    if requested_max_steps > steps:
        raise InputError(
            f"--max_steps {requested_max_steps} would go past one pass over the "
            f"{num_train_blocks} training blocks ({steps} steps); raise --max_train_tokens instead"
        )
    if requested_max_steps > 0:
        logger.warning(
            "stopping after --max_steps %d of the %d steps the token budget allows",
            requested_max_steps,
            steps,
        )
        return requested_max_steps
    return steps


def tokens_seen(step: int, batch_blocks: int, num_train_blocks: int, block_size: int) -> int:
    """Training tokens consumed after `step` optimizer steps (the last step may be partial)."""
    return min(step * batch_blocks, num_train_blocks) * block_size


@contextmanager
def trainer_creation_environment(log_dir: Path, regional_compilation: bool) -> Iterator[None]:
    """While Trainer is created, the environment variables it reads there and only there.

    transformers 5 takes TensorBoard's folder from TENSORBOARD_LOGGING_DIR (`logging_dir` is
    gone), read once by the callback's constructor; accelerate decides whether
    `--torch_compile` compiles each repeated block on its own from
    ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION, read once by the TorchDynamoPlugin that Trainer
    builds. The variables are restored afterwards.
    """
    values = {
        "TENSORBOARD_LOGGING_DIR": str(log_dir),
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "true" if regional_compilation else "false",
    }
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


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


def parameter_checksum(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes: equal on all ranks iff the replicas are in sync."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(name.encode())
        digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()
