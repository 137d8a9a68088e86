"""What the launcher asked for, checked against what the training processes actually got."""

from __future__ import annotations

import os

from transformers import TrainingArguments

from common.cli import InputError


def check_processes_joined(training_args: TrainingArguments) -> None:
    """Refuse a launch whose processes did not join one training (each would train alone)."""
    launched_processes = int(os.environ.get("WORLD_SIZE", "1"))
    if launched_processes != training_args.world_size:
        raise InputError(
            f"the launcher started {launched_processes} processes but they did not join one "
            f"training ({training_args.world_size} seen): on CPU pass --use_cpu true (or set "
            "ACCELERATE_USE_CPU=1), else check that every process sees its GPU"
        )
