"""Every adjustment this project makes to a library it depends on, in one place.

Each fix names the library, the versions known to need it and a one-line reason. It is applied
only to those versions; on any other version it warns once and leaves the library alone, and
`tests/test_library_fixes.py` checks that the unadjusted library still misbehaves, so the test
fails the day upstream fixes it and the fix can go.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version

from packaging.specifiers import SpecifierSet

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


def _honour_sharding_plugins_on_cpu() -> None:
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original_init = AcceleratorState.__init__
    if getattr(original_init, "honours_sharding_on_cpu", False):
        return
    signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def init(self, *args, **kwargs):
        first_initialisation = not AcceleratorState._shared_state
        original_init(self, *args, **kwargs)
        if not first_initialisation or self.distributed_type != DistributedType.MULTI_CPU:
            return
        plugins = signature.bind(self, *args, **kwargs).arguments
        deepspeed_plugin, fsdp_plugin = plugins.get("deepspeed_plugin"), plugins.get("fsdp_plugin")
        # What AcceleratorState does for the GPU distributed types, on gloo CPU processes.
        if deepspeed_plugin is not None:
            selectable = (
                deepspeed_plugin if isinstance(deepspeed_plugin, dict) else {"": deepspeed_plugin}
            )
            for plugin in selectable.values():
                plugin.set_mixed_precision(self._mixed_precision)
            next(iter(selectable.values())).select(_from_accelerator_state=True)
            self.deepspeed_plugins = deepspeed_plugin
            self.distributed_type = DistributedType.DEEPSPEED
            self._mixed_precision = "no"  # DeepSpeed's own config carries the precision
        elif fsdp_plugin is not None:
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            self.distributed_type = DistributedType.FSDP
        PartialState._shared_state["distributed_type"] = self.distributed_type

    init.honours_sharding_on_cpu = True
    AcceleratorState.__init__ = init


FIXES = (
    LibraryFix(
        name="sharding plugins on CPU processes",
        library="accelerate",
        versions=SpecifierSet("==1.15.*"),
        reason=(
            "AcceleratorState switches to FSDP or DeepSpeed only from GPU-class distributed "
            "types, so on gloo CPU processes it drops the plugin and trains as plain DDP"
        ),
        apply=_honour_sharding_plugins_on_cpu,
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
