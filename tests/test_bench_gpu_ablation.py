"""The GPU benchmark's rows, checked by its dry run on CPU: the course config (compiled,
chunked loss, checkpoints) as a whole run beside an eager one, one table from their summaries;
a rerun reads finished rows back, and a row past the time limit is said not to have run."""

import json
import shlex
from pathlib import Path

import pytest

from bench import gpu_ablation, variants
from common.run_contract import GPT_REQUIRED_KEYS, GPT_SUMMARY_FILE, GPT_SUMMARY_VERSION
from tokenizer.train import STATS_FILE

pytestmark = pytest.mark.multiprocess


def table_rows(output_dir) -> dict[str, dict[str, str]]:
    lines = (output_dir / "table.md").read_text().splitlines()
    header, _, *rows = lines[lines.index("") + 1 :]
    columns = [cell.strip() for cell in header.split("|")]
    cells = ([cell.strip() for cell in row.split("|")] for row in rows)
    return {row[1]: dict(zip(columns, row, strict=True)) for row in cells}


def test_dry_run_trains_whole_rows_tabulates_them_and_continues_after_the_time_limit(
    wos_corpus_dir, tiny_tokenizer_dir, tmp_path
):
    output_dir = tmp_path / "bench"
    argv = [
        "--scale", "dry_run",
        "--corpus", str(wos_corpus_dir),
        "--tokenizer_dir", str(tiny_tokenizer_dir),
        "--output_dir", str(output_dir),
        "--rows", "main", "eager",
    ]  # fmt: skip
    assert gpu_ablation.main(argv) == 0
    main_run = json.loads((output_dir / "runs" / "main" / GPT_SUMMARY_FILE).read_text())
    eager_run = json.loads((output_dir / "runs" / "eager" / GPT_SUMMARY_FILE).read_text())
    assert main_run["speed_settings"]["loss_implementation"] == "chunked"
    assert main_run["speed_settings"]["compile"] and not eager_run["speed_settings"]["compile"]
    # Whole runs: the full budget, and the shipped checkpoints (none).
    assert main_run["tokens_trained"] == eager_run["tokens_trained"] == 16384
    assert not list((output_dir / "runs" / "main").glob("checkpoint-*"))
    rows = table_rows(output_dir)
    assert list(rows) == ["main", "eager"]
    assert rows["main"]["whole run s"] == f"{main_run['wall_seconds']:.1f}"
    assert rows["eager"]["steps"] == str(eager_run["global_step"])

    # No time left: the finished rows are read back as they were, the new one does not run.
    written = (output_dir / "runs" / "main" / GPT_SUMMARY_FILE).stat().st_mtime_ns
    argv += ["checkpoints", "--time_limit_s", "0"]
    assert gpu_ablation.main(argv) == 1
    assert (output_dir / "runs" / "main" / GPT_SUMMARY_FILE).stat().st_mtime_ns == written
    again = table_rows(output_dir)
    assert again["main"] == rows["main"] and again["eager"] == rows["eager"]
    assert again["checkpoints"]["whole run s"].startswith("FAILED: not run: time limit")
    assert not (output_dir / "runs" / "checkpoints").exists()


def test_a_tokenizer_made_for_another_vocabulary_is_not_reused(wos_corpus_dir, tmp_path):
    args = gpu_ablation.AblationArguments(output_dir=str(tmp_path), corpus=[str(wos_corpus_dir)])
    folders = set()
    for vocab_size in (512, 640, 512):
        scale = gpu_ablation.Scale(2, vocab_size, 16384, 60)
        _, tokenizer_dir = gpu_ablation.prepare_inputs(args, scale)
        stats = json.loads((Path(tokenizer_dir) / STATS_FILE).read_text())
        assert stats["requested_vocab_size"] == vocab_size
        folders.add(tokenizer_dir)
    assert len(folders) == 2  # the third call finds the first one's tokenizer


def test_a_summary_unreadable_or_of_another_version_is_not_read_back(tmp_path):
    command, run_dir = ["python", "pretrain/run.py", "--max_steps", "2"], tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "run.log").write_text(shlex.join(command) + "\n")
    whole = {key: None for key in GPT_REQUIRED_KEYS} | {"summary_version": GPT_SUMMARY_VERSION}
    lacking_a_key = {key: value for key, value in whole.items() if key != "final_loss"}
    other_versions = [{"summary_version": GPT_SUMMARY_VERSION + step} for step in (1, -1)]
    for summary in ["{", *other_versions, lacking_a_key, whole]:
        (run_dir / GPT_SUMMARY_FILE).write_text(summary if summary == "{" else json.dumps(summary))
        read_back = variants.finished_earlier(command, run_dir)
        assert read_back == (whole if summary is whole else None)
