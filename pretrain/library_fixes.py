"""Every adjustment this project makes to a library it depends on, in one place.

Two kinds. Patches (`FIXES`): each names the library, the versions known to need it and a
one-line reason; it is applied only to those versions, on any other version it warns once and
leaves the library alone, and `tests/test_library_fixes.py` checks that the unadjusted library
still misbehaves, so the test fails the day upstream fixes it and the patch can go. Glue: the
settings a library takes from somewhere other than its arguments (environment variables it
reads once, a model attribute, its log lines), each in one function below with its reason.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from pretrain.parallel.strategy import honour_sharding_plugins_on_cpu

if TYPE_CHECKING:
    from torch import nn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LibraryFix:
    """One adjustment: to `library` at `versions`, because of `reason`, done by `apply`."""

    name: str
    library: str
    versions: SpecifierSet
    reason: str
    apply: Callable[[], None]

    def applies_to(self, installed_version: str) -> bool:
        return self.versions.contains(installed_version, prereleases=True)


FIXES = (
    LibraryFix(
        name="sharding plugins on CPU processes",
        library="accelerate",
        versions=SpecifierSet("==1.15.*"),
        reason=(
            "AcceleratorState switches to FSDP or DeepSpeed only from GPU-class distributed "
            "types, so on gloo CPU processes it drops the plugin and trains as plain DDP"
        ),
        apply=honour_sharding_plugins_on_cpu,
    ),
)


@functools.cache
def apply_library_fixes(fixes: tuple[LibraryFix, ...] = FIXES) -> tuple[str, ...]:
    """Apply each fix whose library version needs it (once per process); return their names."""
    applied = []
    for fix in fixes:
        installed = version(fix.library)
        if fix.applies_to(installed):
            fix.apply()
            logger.debug("%s %s: %s (%s)", fix.library, installed, fix.name, fix.reason)
            applied.append(fix.name)
        else:
            logger.warning(
                "%s %s is not a version the fix '%s' was written for (%s): not applied; if "
                "the library no longer needs it (%s), remove it from %s",
                fix.library,
                installed,
                fix.name,
                fix.versions,
                fix.reason,
                __name__,
            )
    return tuple(applied)


# --- Glue: settings libraries read from elsewhere than their arguments ------------------------


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


def use_causal_lm_loss(model: nn.Module) -> None:
    """Name transformers' causal-LM loss on a GPT-2 model.

    transformers picks the loss by the class name, and "GPT2LMHeadModel" names none: it would
    warn on every run, and Trainer would divide the shifted loss by every label instead of the
    block_size - 1 predicted ones per block (the loss read (T-1)/T of its value).
    """
    model.loss_type = "ForCausalLM"


def quiet_deepspeed_cpu_notice() -> None:
    """Drop the line DeepSpeed logs on every start without a GPU.

    accelerate imports DeepSpeed whenever it is installed, and DeepSpeed then announces that it
    uses the CPU; the run logs the device it trains on itself.
    """
    logging.getLogger("DeepSpeed").addFilter(_is_not_deepspeed_cpu_notice)


def _is_not_deepspeed_cpu_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Setting accelerator to CPU")
