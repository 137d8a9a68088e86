"""Write outputs so that an interrupted job never leaves a half-written result behind."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common.cli import InputError


@contextmanager
def atomic_dir(final_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside `final_dir`; rename it into place only on success.

    An existing `final_dir` is refused unless `overwrite` is set, before any work starts.
    """
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
    if final_dir.exists():
        shutil.rmtree(final_dir)
    os.replace(tmp_dir, final_dir)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to a temporary file in the same folder, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=False, default=str)
            handle.write("\n")
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
