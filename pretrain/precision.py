"""Mixed precision and TF32, decided in one place.

Whoever launches the run says the precision once: the accelerate YAML (or `accelerate launch
--mixed_precision`) when it names bf16/fp16, otherwise `--bf16`/`--fp16` on our command line,
otherwise the hardware: bf16 on GPUs that have it (Ampere and newer), fp16 with loss scaling
on older ones (RTX 2080 Ti, V100, T4), fp32 on CPU. `accelerate launch` writes
`mixed_precision: "no"` when nothing was configured, so "no" from the launcher means "not
decided" rather than "fp32".
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from transformers import TrainingArguments
from transformers.utils.import_utils import enable_tf32

from common.cli import InputError

logger = logging.getLogger(__name__)

LAUNCHER_PRECISION_VARIABLE = "ACCELERATE_MIXED_PRECISION"


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run trains in, and who decided it (for the log and the summary)."""

    mixed_precision: str  # "bf16", "fp16" or "no" (fp32)
    source: str
    tf32: bool

    @property
    def name(self) -> str:
        """ "bf16", "fp16" or "fp32"."""
        return "fp32" if self.mixed_precision == "no" else self.mixed_precision


def _launcher_precision() -> str | None:
    value = os.environ.get(LAUNCHER_PRECISION_VARIABLE, "no").lower()
    return None if value == "no" else value


def _flag_precision(training_args: TrainingArguments) -> str | None:
    if training_args.bf16:
        return "bf16"
    if training_args.fp16:
        return "fp16"
    return None


def _hardware_precision(device: torch.device) -> tuple[str, str]:
    if device.type != "cuda":
        return "no", f"{device.type}: fp32"
    name = torch.cuda.get_device_name(device)
    if torch.cuda.is_bf16_supported(including_emulation=False):
        return "bf16", f"{name} supports bf16"
    return "fp16", f"{name} has no bf16"


def resolve_precision(training_args: TrainingArguments) -> PrecisionChoice:
    """Decide bf16/fp16/fp32 and TF32, write the choice into `training_args`, and return it."""
    launcher = _launcher_precision()
    flag = _flag_precision(training_args)
    if launcher and flag and launcher != flag:
        raise InputError(
            f"precision set twice: the accelerate config says {launcher} and the command line "
            f"says --{flag}; drop one of them"
        )
    device = training_args.device
    if launcher:
        mixed_precision, source = launcher, "accelerate config"
    elif flag:
        mixed_precision, source = flag, f"--{flag}"
    else:
        mixed_precision, source = _hardware_precision(device)
        source = f"automatic ({source})"
    if (
        mixed_precision == "bf16"
        and device.type == "cuda"
        and not torch.cuda.is_bf16_supported(including_emulation=False)
    ):
        raise InputError(
            f"{torch.cuda.get_device_name(device)} has no bf16 but {source} asks for it; use "
            "fp16 (accelerate launch --mixed_precision fp16, or --fp16 without accelerate)"
        )
    training_args.bf16 = mixed_precision == "bf16"
    training_args.fp16 = mixed_precision == "fp16"
    training_args.mixed_precision = mixed_precision

    # TF32 matmuls for whatever stays in fp32 (the optimizer, the loss); TrainingArguments
    # already applied an explicit --tf32, and refuses it on GPUs that lack it.
    tf32 = training_args.tf32
    if tf32 is None:
        tf32 = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8
        if tf32:
            enable_tf32(True)
    choice = PrecisionChoice(mixed_precision=mixed_precision, source=source, tf32=bool(tf32))
    logger.info(
        "precision: %s (%s), TF32 %s",
        choice.name,
        source,
        "on" if choice.tf32 else "off",
    )
    return choice
