"""Every adjustment this project makes to a library it depends on, in one place.

Patches (`FIXES`) apply only to the versions known to need them (on others: one warning), and
`tests/test_library_fixes.py` fails the day upstream no longer misbehaves. Glue: the settings a
library takes from elsewhere than its arguments (environment variables, its log lines).
"""

import contextlib
import errno
import functools
import inspect
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import transformers
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, patch_environment
from packaging.specifiers import SpecifierSet

from common.cli import InputError, RunFailed, exception_chain
from common.files import (
    LOCK_FILE,
    damage_in,
    exclusive_lock,
    file_digests,
    read_manifest,
    write_json_atomic,
)
from common.run_contract import CHECKPOINT_MANIFEST_FILE, GPT_SUMMARY_FILE

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LibraryFix:
    """One adjustment: to `library` at `versions`, because of `reason`, done by `apply`."""

    name: str
    library: str
    versions: SpecifierSet
    reason: str
    apply: Callable[[], None]


def honour_sharding_plugins_on_cpu() -> None:
    original_init = AcceleratorState.__init__
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

    AcceleratorState.__init__ = init


FIXES = (
    LibraryFix(
        name="sharding plugins on CPU processes",
        library="accelerate",
        versions=SpecifierSet(">=1.12,<1.16"),
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
        if fix.versions.contains(installed, prereleases=True):
            fix.apply()
            logger.debug("%s %s: %s (%s)", fix.library, installed, fix.name, fix.reason)
            applied.append(fix.name)
        else:
            logger.warning(
                "%s %s is not a version the fix '%s' was written for (%s): not applied; if "
                "the library no longer needs it (%s), remove it from %s",
                fix.library, installed, fix.name, fix.versions, fix.reason, __name__,
            )  # fmt: skip
    return tuple(applied)


# --- Glue: settings libraries read from elsewhere than their arguments ------------------------


@contextmanager
def trainer_creation_environment(log_dir: Path, regional_compilation: bool) -> Iterator[None]:
    """While Trainer is created, the variables it reads only then: TensorBoard's folder
    (transformers 5 has no `logging_dir`) and accelerate's regional compilation."""
    with patch_environment(
        TENSORBOARD_LOGGING_DIR=log_dir,
        ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION="true" if regional_compilation else "false",
    ):
        yield


COMPILE_CACHE_MANIFEST = "compile_cache_manifest.json"
NO_SPACE = os.strerror(errno.ENOSPC)  # in the C++ compiler's and linker's output too
# Loggers of the compiler's output, and of inductor's traceback when it cannot save a graph.
FULL_DISK_LOGGERS = ("torch._functorch._aot_autograd.graph_compile", "torch._inductor.codecache")


def use_compile_cache(folder: Path, explicit: bool, output_dir: Path) -> Path | None:
    """Keep torch.compile's code (inductor's and Triton's caches) in `folder` instead of /tmp,
    which every node and job of a cluster starts without; a variable the user set (not the one
    inductor sets when torch is imported) wins over a default `folder`. Torch imports that
    code as it finds it, so a folder `compile_cache_distrust` names a reason for is moved
    aside, if it is the user's own (not a link); one that cannot be used leaves a new private
    folder (None: nothing to reuse). A folder that is or holds a run folder is refused."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    library_default = os.path.abspath(default_cache_dir())
    for variable, path, default in (
        ("TORCHINDUCTOR_CACHE_DIR", folder, library_default),
        ("TRITON_CACHE_DIR", folder / "triton", None),
    ):
        if explicit or os.environ.get(variable) in (None, default):
            os.environ[variable] = os.path.abspath(path)  # a link, not the folder it names
    folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    if (run_folder := run_folder_in(folder, output_dir)) is not None:
        raise InputError(
            f"the compile cache {folder} holds the run folder {run_folder}, which distrusting "
            "the cache would move aside; pass a --compile_cache_dir of its own (by default "
            "<cache_dir>/compile)"
        )
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with exclusive_lock(folder.parent / f".{folder.name}.lock", wait=True):
            if (distrust := compile_cache_distrust(folder)) is not None:
                info = folder.lstat()
                if info.st_uid != os.getuid() or stat.S_ISLNK(info.st_mode):
                    raise PermissionError(errno.EPERM, "a link, or another user's folder")
                aside = folder.with_name(folder.name + time.strftime(".untrusted-%Y%m%d-%H%M%S"))
                folder.rename(aside)
                folder.mkdir(mode=0o700)
                logger.warning(
                    "compile cache %s is not used (%s): moved to %s; compiling again",
                    folder, distrust, aside.name,
                )  # fmt: skip
        with tempfile.TemporaryFile(dir=folder):
            return folder
    except OSError as err:
        # Not torch's default: a fixed name in /tmp that another user of the node can create.
        private = tempfile.mkdtemp(prefix="torchinductor-")
        logger.warning(
            "compile cache %s cannot be used (%s): compiling in a new private folder, %s",
            folder, err.strerror, private,
        )  # fmt: skip
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = private
        os.environ["TRITON_CACHE_DIR"] = os.path.join(private, "triton")
        return None


# Files only a run folder holds: its lock, its summary, its checkpoints' manifests.
RUN_FOLDER_MARKS = {LOCK_FILE, GPT_SUMMARY_FILE, CHECKPOINT_MANIFEST_FILE}


def run_folder_in(folder: Path, output_dir: Path) -> Path | None:
    """The run folder that `folder` is or holds (this run's, or one that a mark shows)."""
    if folder.resolve() in (output_dir.resolve(), *output_dir.resolve().parents):
        return output_dir
    for root, _, files in os.walk(folder):
        if marks := RUN_FOLDER_MARKS & set(files):
            root = Path(root)
            return root.parent if marks == {CHECKPOINT_MANIFEST_FILE} else root
    return None


def compile_cache_distrust(folder: Path) -> str | None:
    """Why torch must not import the code in `folder`, or None: every entry is the user's own
    and writable by the user alone (as ssh treats keys: nobody else can plant code), and its
    files are exactly those its manifest sealed, unchanged (an empty folder holds no code)."""
    entries = [Path(root) / name for root, dirs, files in os.walk(folder) for name in dirs + files]
    for path in (folder, *entries):
        info = path.lstat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022 or stat.S_ISLNK(info.st_mode):
            return f"{path} is not writable by you alone"
    if (manifest := read_manifest(folder, COMPILE_CACHE_MANIFEST)) is None:
        if not any(path.is_file() for path in entries):
            return None
        return f"no readable {COMPILE_CACHE_MANIFEST}: files nobody sealed"
    return damage_in(folder, manifest["files"], COMPILE_CACHE_MANIFEST)


@contextmanager
def compiled_once(cache: Path | None = None) -> Iterator[None]:
    """While the block runs, dynamo reaching its recompile limit is one line (RunFailed, with
    dynamo's last reason) instead of five lines of warning and the rest of the run silently
    eager (`fail_on_recompile_limit_hit`); so is a compilation that fills the disk of the
    compile `cache` (its linker output not logged). At the end the `cache` is sealed."""
    import torch._dynamo.config

    reasons: list[str] = []

    def keep_reason(record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("torch._dynamo hit config."):
            return True
        reasons.append(str(record.args[3]) if len(record.args) > 3 else "")
        return False

    def drop_full_disk(record: logging.LogRecord) -> bool:  # the run ends on it in one line
        return NO_SPACE not in logging.Formatter().format(record)

    filters = [(logging.getLogger("torch._dynamo.convert_frame"), keep_reason)]
    filters += [(logging.getLogger(name), drop_full_disk) for name in FULL_DISK_LOGGERS]
    for log, log_filter in filters:
        log.addFilter(log_filter)
    try:
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            yield
        # Inductor writes each file by a rename (whole or absent); its lock files are sealed too.
        # Unsealed (another run renaming a file meanwhile, a full disk), it is not used again.
        with contextlib.suppress(OSError):
            if cache is not None:
                # The user's alone to write, whatever the umask.
                for root, _, files in os.walk(cache):
                    for path in [Path(root), *(Path(root) / name for name in files)]:
                        path.chmod(path.stat().st_mode & ~0o022)
                sealed = file_digests(cache, skip=(COMPILE_CACHE_MANIFEST,))
                write_json_atomic(cache / COMPILE_CACHE_MANIFEST, {"files": sealed})
    except Exception as err:
        chain = [f"{type(e).__module__} {e}" for e in exception_chain(err)]
        compiling = any(text.startswith("torch._inductor") for text in chain)
        if cache is not None and compiling and any(NO_SPACE in text for text in chain):
            free = shutil.disk_usage(cache).free / 2**20
            raise RunFailed(
                f"cannot write torch.compile's code in {cache}: {NO_SPACE.lower()} "
                f"({free:,.1f} MiB free); free space, or pass --compile_cache_dir on a "
                "larger disk"
            ) from err
        if not reasons:
            raise
        raise RunFailed(
            f"torch.compile reached dynamo's recompile limit ({reasons[-1]}) and would have "
            "run the rest eagerly; keep --whole_batches, or train with --torch_compile false"
        ) from err
    finally:
        for log, log_filter in filters:
            log.removeFilter(log_filter)


# Lines libraries log on every CPU run that say nothing about it, by logger: the run logs the
# device it trains on itself. accelerate imports DeepSpeed whenever it is installed, which then
# announces the CPU; torch.compile's C++ builds announce that there is no CUDA runtime, and
# TrainingArguments that compiling pays off on recent GPUs.
CPU_NOTICES = {
    "DeepSpeed": "Setting accelerator to CPU",
    "torch.utils.cpp_extension": "No CUDA runtime is found",
    "transformers.training_args": "The speedups for torchdynamo mostly come with GPU",
}


def quiet_cpu_notices() -> None:
    for logger_name, start in CPU_NOTICES.items():
        logging.getLogger(logger_name).addFilter(
            lambda record, start=start: not record.getMessage().startswith(start)
        )


@contextmanager
def library_progress_bars(enabled: bool) -> Iterator[None]:
    """`--disable_tqdm` reaches only Trainer's own bars; hide those of datasets (tokenizing,
    saving blocks) and transformers (writing model shards) too while the run lasts."""
    import datasets  # here: a second to import, which only training needs

    with contextlib.ExitStack() as restore:  # turns back on at the end only what was on
        if not enabled:
            if datasets.utils.is_progress_bar_enabled():
                restore.callback(datasets.utils.enable_progress_bars)
            if transformers.utils.logging.is_progress_bar_enabled():
                restore.callback(transformers.utils.logging.enable_progress_bar)
            datasets.utils.disable_progress_bars()
            transformers.utils.logging.disable_progress_bar()
        yield
