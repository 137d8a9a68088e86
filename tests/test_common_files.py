"""Outputs that are whole or absent, checksums that find damage, locks that die with their
process, strict JSON."""

import json
import math
import re
import subprocess
import sys

import pytest

from common.cli import InputError
from common.files import (
    LockHeld,
    damage_in,
    exclusive_lock,
    file_digests,
    finite_or_null,
    read_manifest,
    replace_dir,
    sealed_folder_damage,
    write_json_atomic,
)
from common.run_contract import (
    CHECKPOINT_MANIFEST_FILE,
    GPT_REQUIRED_KEYS,
    GPT_SUMMARY_FILE,
    GPT_SUMMARY_VERSION,
    NUMBER,
    read_gpt_summary,
)


def test_json_is_strict_nan_and_infinities_become_null(tmp_path):
    data = {"loss": math.nan, "nested": [1.0, math.inf, {"x": -math.inf}], "ok": 2.5}
    write_json_atomic(tmp_path / "a.json", data)
    text = (tmp_path / "a.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"loss": None, "nested": [1.0, None, {"x": None}], "ok": 2.5}
    assert finite_or_null((1.0, math.nan)) == [1.0, None]


def test_digests_find_a_missing_resized_or_changed_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.bin").write_bytes(b"abc")
    (tmp_path / "sub" / "b.bin").write_bytes(b"xyz")
    recorded = file_digests(tmp_path)
    assert set(recorded) == {"a.bin", "sub/b.bin"} and damage_in(tmp_path, recorded) is None
    (tmp_path / "sub" / "b.bin").write_bytes(b"xyZ")
    assert (
        damage_in(tmp_path, recorded) == "sub/b.bin changed since it was written (its "
        "checksum differs)"
    )
    (tmp_path / "a.bin").write_bytes(b"ab")
    assert damage_in(tmp_path, recorded) == "a.bin has 2 bytes, 3 when it was written"
    (tmp_path / "a.bin").unlink()
    assert damage_in(tmp_path, recorded) == "a.bin is missing"


def test_a_held_lock_names_its_holder_and_dies_with_its_process(tmp_path):
    lock = tmp_path / ".lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, pathlib\n"
         "from common.files import exclusive_lock\n"
         f"with exclusive_lock(pathlib.Path({str(lock)!r}), wait=False):\n"
         "    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(LockHeld, match=f"process {holder.pid} on "),
            exclusive_lock(lock, wait=False),
        ):
            pass
    finally:
        holder.kill()  # kill -9: no cleanup of its own
        holder.wait()
    with exclusive_lock(lock, wait=False):  # the kernel released it
        assert "process" in lock.read_text()
    assert not lock.exists()  # the holder removes its lock file when it lets go


def test_a_folder_replaced_while_killed_is_whole_or_absent_never_half(tmp_path):
    """kill -9 between the two renames of `replace_dir`: the old folder is aside, whole; the
    target is absent (never half of either); the next replacement completes."""
    target, new = tmp_path / "final", tmp_path / ".final.tmp"
    for folder, text in ((target, "old"), (new, "new")):
        folder.mkdir()
        (folder / "model").write_text(text)
        (folder / "tokenizer").write_text(text)
    killed = subprocess.run(
        [sys.executable, "-c", "import os, pathlib, signal\n"
         "from common import files\n"
         "renames = []\n"
         "original = pathlib.Path.rename\n"
         "def rename(self, to):\n"
         "    if renames: os.kill(os.getpid(), signal.SIGKILL)  # at the second rename\n"
         "    renames.append(to)\n"
         "    return original(self, to)\n"
         "pathlib.Path.rename = rename\n"
         f"files.replace_dir(pathlib.Path({str(new)!r}), pathlib.Path({str(target)!r}))"],
        check=False,
    )  # fmt: skip
    assert killed.returncode == -9
    assert not target.exists()
    assert (tmp_path / ".final.replaced" / "tokenizer").read_text() == "old"
    replace_dir(new, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]
    assert (target / "tokenizer").read_text() == "new"


def test_a_sealed_folder_names_its_damage(tmp_path):
    (tmp_path / "model").write_bytes(b"weights")
    assert sealed_folder_damage(tmp_path) is None  # no manifest: written before manifests
    manifest = {"files": file_digests(tmp_path)}
    (tmp_path / CHECKPOINT_MANIFEST_FILE).write_text(json.dumps(manifest))
    assert sealed_folder_damage(tmp_path) is None
    (tmp_path / "model").unlink()
    assert sealed_folder_damage(tmp_path) == "model is missing"


# JSON that parses but is not of a manifest's or a summary's shape: damage, never a traceback.
WRONG_SHAPES = (
    "{}",
    "[]",
    '"files"',
    '{"files": null}',
    '{"files": []}',
    '{"files": {"model.safetensors": []}}',
    '{"files": {"model.safetensors": {"bytes": "16", "xxh3_64": 5}}}',
    '{"files": {"model.safetensors": {"bytes": 16}}}',
)


@pytest.mark.parametrize("text", WRONG_SHAPES)
def test_a_manifest_of_the_wrong_shape_is_damage(tmp_path, text):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    (tmp_path / CHECKPOINT_MANIFEST_FILE).write_text(text)
    assert read_manifest(tmp_path) is None
    assert sealed_folder_damage(tmp_path) == f"its {CHECKPOINT_MANIFEST_FILE} is unreadable"


@pytest.mark.parametrize(
    "fields", [{"run_identity": []}, {"run_identity": "x"}, {"save_seconds": "12"}]
)
def test_a_manifest_whose_fields_have_the_wrong_type_is_damage(tmp_path, fields):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    manifest = {"files": file_digests(tmp_path), "run_identity": {}, "save_seconds": 1.5}
    (tmp_path / CHECKPOINT_MANIFEST_FILE).write_text(json.dumps(manifest))
    assert read_manifest(tmp_path) == manifest
    (tmp_path / CHECKPOINT_MANIFEST_FILE).write_text(json.dumps({**manifest, **fields}))
    assert read_manifest(tmp_path) is None


def summary_of_every_required_key():
    """A run_summary.json with each required key of its type."""
    values = {int: 1, str: "pass", dict: {}, list: [], NUMBER: 1.5}
    return {key: values[kind] for key, kind in GPT_REQUIRED_KEYS.items()} | {
        "summary_version": GPT_SUMMARY_VERSION
    }


@pytest.mark.parametrize(
    ("summary", "error"),
    [
        ([], "does not hold a JSON object"),
        ("x", "does not hold a JSON object"),
        ({"summary_version": GPT_SUMMARY_VERSION}, "is damaged: it lacks wall_seconds"),
        ({**summary_of_every_required_key(), "verdict": 5}, "its 'verdict' is a int"),
        ({**summary_of_every_required_key(), "final_loss": "4.2"}, "its 'final_loss' is a str"),
        ({**summary_of_every_required_key(), "config": []}, "its 'config' is a list"),
        ({**summary_of_every_required_key(), "summary_version": "3"}, "'summary_version' is a"),
    ],
)
def test_a_summary_of_the_wrong_shape_is_one_input_error(tmp_path, summary, error):
    path = tmp_path / GPT_SUMMARY_FILE
    path.write_text(json.dumps(summary))
    with pytest.raises(InputError, match=re.escape(error)):
        read_gpt_summary(path)
    path.write_text(json.dumps(summary_of_every_required_key()))
    assert read_gpt_summary(path)["verdict"] == "pass"
