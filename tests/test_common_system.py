"""The node a run finds: its extensions folder (and torch's threads)."""

from __future__ import annotations

import os
import sys

from common.system import build_extensions_in_this_environment


def test_extensions_are_built_in_this_environment_unless_a_folder_is_chosen(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    build_extensions_in_this_environment()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "chosen"))
    build_extensions_in_this_environment()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "chosen")
