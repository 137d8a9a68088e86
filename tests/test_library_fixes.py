"""Each library fix is still needed, does what it says, and stays off library versions it was not
written for. A `still_needed` test that fails means upstream fixed the library: remove the fix."""

import functools
import logging
import subprocess
import sys
from importlib.metadata import version

import pytest
from accelerate.utils.other import get_free_port
from packaging.specifiers import SpecifierSet
from pretrain_runs import subprocess_env

from pretrain.library_fixes import FIXES, LibraryFix, apply_library_fixes

# One CPU process that joins a gloo group of one (as under `accelerate launch`) and asks accelerate
# for FSDP2 or DeepSpeed ZeRO-2 on the CPU, first as released, then with the fixes; it prints the
# distributed type it got each time.
PROBE = """
import sys
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
from pretrain.library_fixes import apply_library_fixes

def distributed_type():
    if sys.argv[1] == "fsdp":
        plugins = {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2)}
    else:
        plugins = {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=2)}
    return Accelerator(cpu=True, **plugins).distributed_type.name

released = distributed_type()
AcceleratorState._reset_state()  # keeps the process group
apply_library_fixes()
print(released, distributed_type())
"""


@functools.cache
def distributed_types_on_cpu(plugin_kind: str) -> tuple[str, str]:
    """(as released, with the fixes) distributed type for `plugin_kind` on a CPU process."""
    port = get_free_port()
    env = {
        **subprocess_env(),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE, plugin_kind],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    released, fixed = result.stdout.split()[-2:]
    return released, fixed


@pytest.mark.multiprocess
@pytest.mark.parametrize("plugin_kind", ["fsdp", "deepspeed"])
def test_accelerate_still_drops_sharding_plugins_on_cpu_processes(plugin_kind):
    released, _ = distributed_types_on_cpu(plugin_kind)
    assert released == "MULTI_CPU"


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("plugin_kind", "expected"), [("fsdp", "FSDP"), ("deepspeed", "DEEPSPEED")]
)
def test_fixed_accelerate_uses_the_requested_plugin_on_cpu_processes(plugin_kind, expected):
    _, fixed = distributed_types_on_cpu(plugin_kind)
    assert fixed == expected


def test_every_fix_was_written_for_the_installed_library_version():
    # Fails when a library is upgraded: check whether the new version still needs the fix (the
    # tests above), then widen its versions or remove it.
    for fix in FIXES:
        installed = version(fix.library)
        assert fix.versions.contains(installed, prereleases=True), (fix.name, installed)


def test_a_fix_for_other_versions_warns_once_and_is_not_applied(caplog):
    calls = []
    fix = LibraryFix(
        name="a fix of an old release",
        library="accelerate",
        versions=SpecifierSet("<0.1"),
        reason="that release misbehaved",
        apply=lambda: calls.append("applied"),
    )
    with caplog.at_level(logging.WARNING, logger="pretrain.library_fixes"):
        assert apply_library_fixes((fix,)) == ()
        assert apply_library_fixes((fix,)) == ()
    assert calls == []
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1
    assert "a fix of an old release" in warnings[0] and "not applied" in warnings[0]
