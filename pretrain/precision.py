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


def resolve_precision(training_args: TrainingArguments) -> PrecisionChoice:
    """Decide bf16/fp16/fp32 and TF32, write the choice into `training_args`, and return it."""
    launcher = os.environ.get(LAUNCHER_PRECISION_VARIABLE, "no").lower()
    flag = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else None
    if launcher != "no" and flag and launcher != flag:
        raise InputError(
            f"precision set twice: the accelerate config says {launcher} and the command line "
            f"says --{flag}; drop one of them"
        )
    device = training_args.device
    if launcher != "no":
        mixed_precision, source = launcher, "accelerate config"
    elif flag:
        mixed_precision, source = flag, f"--{flag}"
    elif device.type != "cuda":
        mixed_precision, source = "no", f"automatic ({device.type}: fp32)"
    elif torch.cuda.is_bf16_supported(including_emulation=False):
        mixed_precision = "bf16"
        source = f"automatic ({torch.cuda.get_device_name(device)} supports bf16)"
    else:
        mixed_precision = "fp16"
        source = f"automatic ({torch.cuda.get_device_name(device)} has no bf16)"
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
    logger.info("precision: %s (%s), TF32 %s", choice.name, source, "on" if tf32 else "off")
    return choice
