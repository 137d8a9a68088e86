"""compare-parallelism: every strategy trains the tiny GPT-2 on two CPU processes, each loss equals
its one-process reference, the sharded strategies hold less per process than DDP, and the table,
JSON and figure come out, and the run report shows them; a strategy that fails is a row with its
error."""

import json

import numpy as np
import pytest
from matplotlib import image as mpimg
from parallel_runs import NUM_BLOCKS
from pretrain_runs import BLOCK_SIZE, shared_data_paths

from bench.compare_parallelism import (
    STRATEGY_SPECS,
    ComparisonRow,
    comparison_table,
    main,
    read_summary,
)
from common.run_contract import (
    GPT_SUMMARY_FILE,
    PARALLELISM_COMPARISON_FIGURE,
    PARALLELISM_COMPARISON_FILE,
    PARALLELISM_COMPARISON_TABLE,
)
from report.build import write_report

pytestmark = pytest.mark.multiprocess

NUM_STEPS = 3
GLOBAL_BATCH = 4  # blocks: 2 per process under data parallel
# Every strategy adds the same numbers in another order; Muon's bf16 Newton-Schulz rounds such
# sums apart (AdamW's rows: fp32 rounding, 1e-4, in each strategy's own test).
LOSS_TOLERANCE = 0.02
SHARDED = ("fsdp", "zero2", "zero3", "tp", "pp-gpipe", "pp-1f1b")


@pytest.fixture
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


def comparison_argv(data_paths: dict, output_dir, *options: str) -> list[str]:
    return [
        "--output_dir", str(output_dir),
        "--max_steps", str(NUM_STEPS),
        "--global_batch_size", str(GLOBAL_BATCH),
        "--num_processes", "2",
        *options,
        "--",  # pretrain/run.py's flags, for every strategy
        "--corpus", str(data_paths["corpus_dir"]),
        "--tokenizer_dir", str(data_paths["tokenizer_dir"]),
        "--cache_dir", str(data_paths["cache_dir"]),
        # The budget of the DDP and model-parallel tests: one cache of packed blocks for all.
        "--max_train_tokens", str(NUM_BLOCKS * BLOCK_SIZE),
    ]  # fmt: skip


def test_every_strategy_trains_like_its_reference_and_sharding_holds_less(data_paths, tmp_path):
    output_dir = tmp_path / "comparison"
    assert main(comparison_argv(data_paths, output_dir)) == 0

    comparison = json.loads((output_dir / PARALLELISM_COMPARISON_FILE).read_text())
    rows = {row["strategy"]: row for row in comparison["rows"]}
    assert list(rows) == list(STRATEGY_SPECS)
    for name, row in rows.items():
        assert row["error"] is None, f"{name}: {row['error']}"
        assert (output_dir / row["run_dir"] / GPT_SUMMARY_FILE).is_file()
        assert row["global_batch_tokens"] == GLOBAL_BATCH * BLOCK_SIZE
        assert row["num_processes"] == (1 if name in ("single", "single-loop") else 2)
        assert row["tokens_per_second"] > 0 and row["peak_memory_bytes"] > 0
        assert row["optimizer"] == "Muon + adamw_torch_fused"  # the shipped recipe, by default
    assert rows["ddp"]["blocks_per_process"] == GLOBAL_BATCH // 2
    assert rows["tp"]["blocks_per_process"] == GLOBAL_BATCH

    # One reference for both loops: pretrain/run.py in one process.
    assert rows["single"]["reference"] is None and rows["single"]["loss_difference"] == 0.0
    for name, row in rows.items():
        if name != "single":
            assert row["reference"] == "single"
            assert row["final_loss"] == pytest.approx(
                rows["single"]["final_loss"], abs=LOSS_TOLERANCE
            )
            assert abs(row["loss_difference"]) <= LOSS_TOLERANCE

    # DDP keeps a whole replica per process, as one process does; sharding keeps less.
    ddp_bytes = rows["ddp"]["parameter_and_optimizer_bytes"]
    assert ddp_bytes == rows["single"]["parameter_and_optimizer_bytes"]
    for name in SHARDED:
        assert rows[name]["parameter_and_optimizer_bytes"] < ddp_bytes, name
    assert rows["zero3"]["parameter_bytes"] < rows["zero2"]["parameter_bytes"]

    table = (output_dir / PARALLELISM_COMPARISON_TABLE).read_text().splitlines()
    assert len(table) == 2 + len(STRATEGY_SPECS)
    assert all(line.endswith("| ok |") for line in table[2:])

    pixels = mpimg.imread(output_dir / PARALLELISM_COMPARISON_FIGURE)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 600
    colours = pixels[..., :3].reshape(-1, 3)
    # Not blank: bars in several colours, not a white page.
    assert (colours < 0.9).any(axis=1).mean() > 0.05
    assert len(np.unique(np.round(colours, 1), axis=0)) > 5

    # The report recognises the folder and embeds the table and the figure.
    report = write_report([output_dir], tmp_path / "report")
    text = report.read_text()
    assert "## Parallelism comparison" in text and "## GPT-2 pretraining" not in text
    assert "\n".join(table) in text
    (figure,) = report.parent.glob("parallelism_comparison_*.png")
    assert f"]({figure.name})" in text
    assert figure.read_bytes() == (output_dir / PARALLELISM_COMPARISON_FIGURE).read_bytes()


def test_a_failing_strategy_is_a_row_with_its_error_and_the_exit_code_says_so(data_paths, tmp_path):
    output_dir = tmp_path / "comparison"
    # 3 microbatches cannot split a batch of 4 blocks: pretrain.run_model_parallel refuses it.
    argv = comparison_argv(
        data_paths, output_dir, "--strategies", "pp-gpipe", "--num_microbatches", "3"
    )
    assert main(argv) == 1

    comparison = json.loads((output_dir / PARALLELISM_COMPARISON_FILE).read_text())
    rows = {row["strategy"]: row for row in comparison["rows"]}
    assert list(rows) == ["single", "pp-gpipe"]  # the reference is added
    assert rows["single"]["error"] is None
    error = rows["pp-gpipe"]["error"]
    assert error.startswith("exit code 1: error:") and "--num_microbatches" in error
    assert rows["pp-gpipe"]["loss_difference"] is None
    assert (output_dir / "pp-gpipe.log").read_text().count("error:") >= 1
    assert (output_dir / PARALLELISM_COMPARISON_FIGURE).is_file()


def test_bad_options_are_refused_before_anything_is_written(data_paths, tmp_path, capsys):
    output_dir = tmp_path / "comparison"
    assert main(comparison_argv(data_paths, output_dir, "--strategies", "zero4")) == 2
    assert main(comparison_argv(data_paths, output_dir, "--global_batch_size", "5")) == 2
    errors = capsys.readouterr().err.splitlines()
    assert "invalid choice: 'zero4'" in errors[-2] and "zero3" in errors[-2]
    assert "--global_batch_size 5" in errors[-1] and "multiple" in errors[-1]
    assert not output_dir.exists()
    # A typo among pretrain/run.py's flags: one line, and --overwrite deletes nothing yet.
    (output_dir / "earlier").mkdir(parents=True)
    argv = comparison_argv(data_paths, output_dir, "--overwrite", "true")
    assert main([*argv, "--max_train_tokenz", "5"]) == 2
    assert "--max_train_tokenz" in capsys.readouterr().err.splitlines()[-1]
    assert (output_dir / "earlier").is_dir()


def test_a_run_without_a_step_time_shows_its_speed_as_missing():
    # One step done: there is no step after the first to time.
    rank = {"parameter_bytes": 100, "optimizer_state_bytes": 200, "peak_memory_bytes": 400,
            "peak_memory_source": "rss"}  # fmt: skip
    summary = {
        "parallelism": {"strategy": "ddp", "ranks": [rank, rank]},
        "speed_settings": {"precision": "fp32"},
        "config": {"MuonArguments": {"muon": False}, "TrainingArguments": {"optim": "adamw_torch"}},
        "global_batch_tokens": 128,
        "final_loss": 5.0,
        "global_step": 1,
        "first_step_seconds": 0.5,
        "train_loop_seconds": 0.5,
    }
    row = ComparisonRow("ddp", "single", "command", "ddp", 2, 2, 1.0)
    read_summary(row, STRATEGY_SPECS["ddp"], summary)
    assert row.succeeded and row.step_seconds is None and row.tokens_per_second is None
    (line,) = comparison_table([row])[2:]
    cells = [cell.strip() for cell in line.split("|")[1:-1]]
    assert cells[-3:] == ["-", "-", "ok"] and cells[4] == "adamw_torch"
