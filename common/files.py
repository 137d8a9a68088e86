"""Write outputs so that an interrupted job never leaves a half-written result behind, check
that what was written is still whole, and keep two processes from writing the same thing.
"""

import json
import logging
import math
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import filelock
import xxhash

from common.cli import InputError
from common.run_contract import CHECKPOINT_MANIFEST_FILE, NUMBER, read_json_object

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
HASH_CHUNK_BYTES = 8 << 20


@contextmanager
def atomic_dir(final_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside `final_dir`; rename it into place only on success. An
    existing `final_dir` is refused unless `overwrite` is set, before any work starts."""
    final_dir = Path(final_dir)
    if final_dir.exists() and not overwrite:
        raise InputError(
            f"output folder {final_dir} already exists; pass --overwrite to replace it"
        )
    try:
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.tmp-", dir=final_dir.parent))
    except OSError as err:
        raise InputError(f"cannot write to {final_dir.parent}: {err.strerror}") from None
    try:
        yield tmp_dir
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    replace_dir(tmp_dir, final_dir)


def replace_dir(new_dir: Path, target: Path) -> None:
    """Put `new_dir` in `target`'s place by renames: `target` is the old folder, then for an
    instant none, then the new one; never half of either. A kill between the two renames
    leaves the old folder as `.<name>.replaced`, which the next replacement removes."""
    replaced = target.with_name(f".{target.name}.replaced")
    shutil.rmtree(replaced, ignore_errors=True)
    if target.exists():
        target.rename(replaced)
    new_dir.rename(target)
    shutil.rmtree(replaced, ignore_errors=True)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to a temporary file in the same folder, then rename it over `path`; strict
    JSON, which every parser reads: a NaN or an infinity is written as null."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(finite_or_null(data), handle, indent=2, allow_nan=False, default=str)
            handle.write("\n")
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def finite_or_null(data: Any) -> Any:
    """`data` with every NaN and infinity (in nested dicts, lists and tuples) turned into None."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: finite_or_null(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [finite_or_null(value) for value in data]
    return data


def file_digests(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Size and xxh3-64 digest of every file under `folder` (relative POSIX path -> record),
    those named in `skip` left out; fast enough (several GB/s) to check on every reuse."""
    return {
        path.relative_to(folder).as_posix(): file_record(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name not in skip
    }


def file_record(path: Path) -> dict[str, Any]:
    digest = xxhash.xxh3_64()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return {"bytes": path.stat().st_size, "xxh3_64": digest.hexdigest()}


def damage_in(
    folder: Path, recorded: dict[str, dict[str, Any]], manifest: str | None = None
) -> str | None:
    """Why `folder` no longer holds the files `recorded` by `file_digests` (None when it does): a
    name outside it, a link or other than a regular file in it (another run's weights, a FIFO),
    a file the `manifest` so named did not record, the first missing, resized or changed file."""
    for relative in recorded:
        if PurePosixPath(relative).is_absolute() or ".." in PurePosixPath(relative).parts:
            return f"its manifest names {relative}, outside {folder.name}/"
    if folder.is_symlink():
        return f"{folder.name} is a symbolic link"
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            path = Path(root, name)
            relative = path.relative_to(folder).as_posix()
            if path.is_symlink():
                return f"{relative} is a symbolic link, not a file of {folder.name}/"
            if name in files and not path.is_file():
                return f"{relative} is not a regular file"
            if name in files and manifest not in (None, name) and relative not in recorded:
                return f"{relative} was not sealed"
    for relative, record in recorded.items():
        path = folder / relative
        if not path.is_file():
            return f"{relative} is missing"
        size = path.stat().st_size
        if size != record["bytes"]:
            return f"{relative} has {size:,} bytes, {record['bytes']:,} when it was written"
    for relative, record in recorded.items():
        if file_record(folder / relative)["xxh3_64"] != record["xxh3_64"]:
            return f"{relative} changed since it was written (its checksum differs)"
    return None


MANIFEST_KEY_TYPES = {
    "files": dict, "run_identity": dict, "written_by": dict, "save_seconds": NUMBER
}  # fmt: skip


def read_manifest(
    folder: Path,
    name: str = CHECKPOINT_MANIFEST_FILE,
    key_types: dict[str, type | tuple[type, ...]] = MANIFEST_KEY_TYPES,
) -> dict[str, Any] | None:
    """The manifest `name` that seals a folder (a checkpoint, a run's final model, a block
    cache), or None when it has none, or it is unreadable or not of a manifest's shape (a save
    cut short, a damaged file): `files` maps names to their size and checksum. The one rule
    for a complete save: the manifest is written last, so a folder with one that reads is
    complete (launch-pretraining's newest checkpoint, the unfinished saves a failed run
    removes); resuming also checks its files against it (`checkpoint_damage`)."""
    try:
        manifest = read_json_object(folder / name, key_types=key_types)
    except InputError:
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(record, dict)
        and isinstance(record.get("bytes"), int)
        and isinstance(record.get("xxh3_64"), str)
        for record in files.values()
    ):
        return None
    return manifest


def sealed_folder_damage(
    folder: Path,
    name: str = CHECKPOINT_MANIFEST_FILE,
    key_types: dict[str, type | tuple[type, ...]] = MANIFEST_KEY_TYPES,
) -> str | None:
    """Why a folder sealed by its manifest `name` is not whole (its manifest unreadable, a file
    missing, resized or changed); None when whole or without a manifest (saved before them)."""
    manifest = read_manifest(folder, name, key_types)
    if manifest is None:
        return f"its {name} is unreadable" if (folder / name).exists() else None
    return damage_in(folder, manifest["files"])


class LockHeld(Exception):
    """Another process holds the lock; the message says which (pid, host, since when)."""


@contextmanager
def exclusive_lock(lock_path: Path, wait: bool) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` while the block runs (filelock's `flock`), the
    holder's pid, host and start time in the file, removed after. The kernel drops the lock
    however its process ends (kill -9 too): a file left behind names a holder that is gone, and
    the next holder writes over it. With `wait`, block until the holder lets go (saying so
    once); without, raise `LockHeld` naming the holder."""
    lock = filelock.FileLock(lock_path, thread_local=False, on_acquired=_name_the_holder)
    try:
        lock.acquire(blocking=False)
    except filelock.Timeout:
        try:
            holder = Path(lock_path).read_text(encoding="utf-8").strip() or "another process"
        except OSError:
            holder = "another process"
        if not wait:
            raise LockHeld(holder) from None
        logger.info("waiting for %s, held by %s", lock_path, holder)
        lock.acquire()
    try:
        yield
    finally:
        # Removed while still held: a waiter then takes the lock on the path's next file.
        Path(lock_path).unlink(missing_ok=True)
        lock.release()


def _name_the_holder(fd: int) -> None:
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()} since {started}\n".encode(), 0)
