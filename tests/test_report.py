"""The run report (run-report) on real tiny runs of both stages, and on damaged run
folders."""

import ast
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

from common import run_contract as contract
from common.cli import InputError
from common.files import LOCK_FILE, exclusive_lock
from report import build, sections
from report.__main__ import main as run_report
from report.run_folder import find_event_dirs, load_run

REPO_ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- real tiny runs (once per module)


@pytest.fixture(scope="module")
def gpt_run_dir(tmp_path_factory, wos_corpus_dir, tiny_tokenizer_dir) -> Path:
    """A real pretraining run: the tiny preset, 12 steps of 4 blocks of 64 tokens on CPU."""
    from pretrain_runs import tiny_run_argv

    from pretrain.run import main as pretrain

    root = tmp_path_factory.mktemp("gpt")
    output_dir = root / "gpt_tiny"
    argv = tiny_run_argv(
        wos_corpus_dir,
        tiny_tokenizer_dir,
        root / "cache",
        output_dir,
        num_blocks=48,
        logging_steps=1,
        peak_tflops=1,  # a made-up peak, so that the summary holds an MFU to report
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
        assert pretrain(argv) == 0
    return output_dir


@pytest.fixture(scope="module")
def gpt_cpu_run_dir(tmp_path_factory, wos_corpus_dir, tiny_tokenizer_dir) -> Path:
    """A pretraining run as a CPU gives it: no peak FLOP/s known, hence no MFU. 4 steps."""
    from pretrain_runs import tiny_run_argv

    from pretrain.run import main as pretrain

    root = tmp_path_factory.mktemp("gpt_cpu")
    output_dir = root / "gpt_cpu"
    argv = tiny_run_argv(
        wos_corpus_dir, tiny_tokenizer_dir, root / "cache", output_dir, num_blocks=16
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
        assert pretrain(argv) == 0
    return output_dir


@pytest.fixture(scope="module")
def gpt_report_dir(gpt_run_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "gpt"
    assert run_report([str(gpt_run_dir), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def mnist_report_dir(mnist_pytorch_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "mnist"
    assert run_report([str(mnist_pytorch_run), "--out", str(out)]) == 0
    return out


# ---------------------------------------------------------------- helpers that read a report back


def assert_png_not_blank(path: Path) -> np.ndarray:
    """The PNG decodes and shows something: its pixels vary."""
    pixels = mpimg.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100, path
    assert pixels[..., :3].std() > 0.02, f"{path.name} is (nearly) one colour"
    return pixels


def embedded_figures(markdown: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)


def table_after(markdown: str, heading: str) -> dict[str, list[str]]:
    """The first Markdown table after `heading`: row label -> cells (one per run)."""
    lines = markdown[markdown.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        rows[cells[0]] = [cell.strip() for cell in cells[1:]]
    return rows


def assert_cell_shows(cell: str, value, key: str) -> None:
    """A cell shows the JSON value: exactly for integers, text and flags; floats to 4 digits."""
    if isinstance(value, bool):
        assert cell in {"yes", "no", "pass", "fail"}, (key, cell)
        assert (cell in {"yes", "pass"}) == value, (key, cell, value)
    elif isinstance(value, int):
        assert int(cell.replace(",", "")) == value, (key, cell, value)
    elif isinstance(value, float):
        shown = float(cell.replace(",", ""))
        # Four significant digits: off by at most half a unit in the fourth digit.
        assert math.isclose(shown, value, rel_tol=5e-4, abs_tol=1e-12), (key, cell, value)
    elif value is None:
        assert cell == "n/a", (key, cell)
    else:
        assert cell == str(value), (key, cell, value)


def label_of(rows, key: str) -> str:
    return next(row.label for row in rows if row.key == key)


def assert_rows_show_required_keys(
    results, rows, summary, required_keys, not_in_table=("summary_version",)
) -> None:
    """Every required summary key that holds one value has its row, showing that value."""
    row_keys = {row.key for row in rows}
    scalar_keys = [
        key
        for key in required_keys
        if key not in not_in_table and not isinstance(summary[key], dict | list)
    ]
    assert set(scalar_keys) <= row_keys, set(scalar_keys) - row_keys
    for key in scalar_keys:
        (cell,) = results[label_of(rows, key)]
        assert_cell_shows(cell, summary[key], key)


# ---------------------------------------------------------------- reports of real runs


def test_gpt_report_numbers_equal_the_summary(gpt_run_dir, gpt_report_dir):
    summary = json.loads((gpt_run_dir / contract.GPT_SUMMARY_FILE).read_text())
    markdown = (gpt_report_dir / build.REPORT_FILE).read_text()
    results = table_after(markdown, "## GPT-2 pretraining")
    assert_rows_show_required_keys(
        results,
        sections.GPT_ROWS,
        summary,
        contract.GPT_REQUIRED_KEYS,
        not_in_table=("summary_version", "accelerator_state"),
    )
    assert summary["accelerator_state"].strip() in markdown
    (verdict_cell,) = results[label_of(sections.GPT_ROWS, "verdict")]
    assert verdict_cell == ("pass" if summary["final_loss"] < summary["loss_threshold"] else "fail")

    speed = table_after(markdown, "### Speed settings in force")
    assert set(speed) == set(summary["speed_settings"])
    for name, value in summary["speed_settings"].items():
        assert_cell_shows(speed[name][0], value, name)
    versions = table_after(markdown, "### Library versions")
    assert versions["torch"] == [summary["versions"]["torch"]]


def test_gpt_report_figures(gpt_run_dir, gpt_report_dir):
    markdown = (gpt_report_dir / build.REPORT_FILE).read_text()
    figures = embedded_figures(markdown)
    assert {"gpt_loss.png", "gpt_learning_rate.png", "gpt_throughput.png"} <= set(figures)
    for name in figures:
        assert_png_not_blank(gpt_report_dir / name)
    # GPU curves only when the run sampled a GPU (not on a CPU test machine).
    assert ("gpt_gpu.png" in figures) == (contract.GPU_UTILIZATION in load_run(gpt_run_dir).scalars)
    assert "Notes" not in markdown, "a finished run needs no notes"
    assert sections.NO_PEAK_FLOPS not in markdown, "the run was given a peak, so it has an MFU"


def test_run_without_peak_flops_has_no_empty_mfu_panel(
    gpt_cpu_run_dir, gpt_run_dir, gpt_report_dir, tmp_path
):
    cpu_run = load_run(gpt_cpu_run_dir)
    assert contract.MFU not in cpu_run.scalars and cpu_run.summary["mfu"] is None
    out = tmp_path / "report"
    assert run_report([str(gpt_cpu_run_dir), "--out", str(out)]) == 0
    markdown = (out / build.REPORT_FILE).read_text()
    assert f"MFU of `gpt_cpu`: not shown, {sections.NO_PEAK_FLOPS}" in markdown
    results = table_after(markdown, "## GPT-2 pretraining")
    assert results[label_of(sections.GPT_ROWS, "mfu")] == ["n/a"]
    # The throughput figure holds the tokens/s panel alone: half as wide as with the MFU panel.
    alone = assert_png_not_blank(out / "gpt_throughput.png")
    with_mfu = mpimg.imread(gpt_report_dir / "gpt_throughput.png")
    assert alone.shape[0] == with_mfu.shape[0]
    assert alone.shape[1] == pytest.approx(with_mfu.shape[1] / 2, abs=2)

    # Compared with a run that has an MFU: the panel is drawn, the note names only the other run.
    out = tmp_path / "compare"
    assert run_report([str(gpt_run_dir), str(gpt_cpu_run_dir), "--out", str(out)]) == 0
    markdown = (out / build.REPORT_FILE).read_text()
    assert mpimg.imread(out / "gpt_throughput.png").shape == with_mfu.shape
    assert f"MFU of `gpt_cpu`: not shown, {sections.NO_PEAK_FLOPS}" in markdown
    assert "MFU of `gpt_tiny`" not in markdown


def test_gpu_samples_and_nvidia_smi_snapshot_are_reported(gpt_run_dir, tmp_path):
    # What a GPU run adds: the NVML sampler's tags (written here as the sampler writes them,
    # a CPU test has no GPU to sample) and the nvidia-smi snapshot.
    from torch.utils.tensorboard import SummaryWriter

    gpu_run = tmp_path / "gpt_gpu"
    shutil.copytree(gpt_run_dir, gpu_run)
    with SummaryWriter(str(gpu_run / contract.TENSORBOARD_DIR)) as writer:
        for step in range(1, 13):
            writer.add_scalar(contract.GPU_UTILIZATION, 90.0 + step % 3, step)
            writer.add_scalar(contract.GPU_MEMORY_USED, 20.0 + step / 10, step)
            writer.add_scalar(contract.GPU_POWER, 400.0 + step, step)
    snapshot = "| NVIDIA-SMI 580.65  Driver Version: 580.65 |\n|  0  NVIDIA H200  95% |\n"
    (gpu_run / contract.NVIDIA_SMI_FILE).write_text(snapshot)

    out = tmp_path / "report"
    markdown = build.write_report([gpu_run], out).read_text()
    assert "gpt_gpu.png" in embedded_figures(markdown)
    assert_png_not_blank(out / "gpt_gpu.png")
    assert snapshot.strip() in markdown


def test_probe_results_are_reported_with_the_confusion_matrix(gpt_run_dir, tmp_path):
    from labelled_wos import python_reference_documents, write_labelled_wos

    from probe.run import main as probe

    probed = tmp_path / "gpt_probed"
    shutil.copytree(gpt_run_dir, probed)
    corpus = write_labelled_wos(tmp_path / "WebOfScience", python_reference_documents())
    argv = ["--run_dir", str(probed), "--corpus", str(corpus), "--max_length", "64"]
    argv += ["--use_cpu", "true", "--methods", contract.PROBE_PRETRAINED, contract.PROBE_TFIDF]
    assert probe(argv) == 0
    results = json.loads((probed / contract.PROBE_DIR / "domain.json").read_text())

    out = tmp_path / "report"
    markdown = build.write_report([probed], out).read_text()
    table = table_after(markdown, "### Classification probe of `gpt_probed`: domain")
    for method, scores in results["methods"].items():
        cells = dict(
            zip(
                ["classifier", *(label for label, _ in sections.PROBE_COLUMNS)],
                table[f"`{method}`"],
                strict=True,
            )
        )
        for label, key in sections.PROBE_COLUMNS:
            assert_cell_shows(cells[label], scores[key], key)
    assert_cell_shows(table["chance"][1], results["chance"]["majority_class_accuracy"], "chance")
    assert results["pretraining_overlap"]["verdict"] in markdown
    figure = "gpt_probe_confusion_matrix_gpt_probed_domain.png"
    assert figure in embedded_figures(markdown)
    assert_png_not_blank(out / figure)


def test_unreadable_probe_results_are_noted(gpt_run_dir, tmp_path):
    run = tmp_path / "gpt_tiny"
    shutil.copytree(gpt_run_dir, run)
    (run / contract.PROBE_DIR).mkdir()
    (run / contract.PROBE_DIR / "domain.json").write_text("{ not json")
    (run / contract.PROBE_DIR / "area.json").write_text(json.dumps({"probe_version": 0}))
    record = load_run(run)
    assert record.probes == {}
    assert any("domain.json is not valid JSON" in note for note in record.notes)
    assert any("area.json has probe_version 0" in note for note in record.notes)
    assert any("area.json lacks label_level" in note for note in record.notes)


def test_probe_curve_skips_null_values_of_older_results(tmp_path):
    """Older probe results hold null where a value was missing (a NaN is written as null):
    those points are left out, and a curve with no point left is not drawn."""
    from report.plots import plot_probe_curves, probe_curves
    from report.run_folder import GPT_KIND, RunRecord

    points = [
        {"tokens": 0, "accuracy": 0.25},
        None,
        {"tokens": 100, "accuracy": None},
        {"tokens": None, "accuracy": 0.5},
        {"tokens": 200, "accuracy": 0.75},
    ]
    probes = {
        "domain": {"chance": None, "curve": {"points": points}},
        "area": {"curve": {"points": [{"tokens": 0, "accuracy": None}]}},
    }
    run = RunRecord(tmp_path / "gpt_old", GPT_KIND, summary={"data": None}, probes=probes)
    assert probe_curves(run) == {"domain": [(0, 0.25), (200, 0.75)]}
    assert plot_probe_curves([run], tmp_path / "curve.png")
    assert_png_not_blank(tmp_path / "curve.png")


def test_mnist_report_numbers_and_figures(mnist_pytorch_run, mnist_report_dir):
    metrics = json.loads((mnist_pytorch_run / contract.MNIST_METRICS_FILE).read_text())
    markdown = (mnist_report_dir / build.REPORT_FILE).read_text()
    results = table_after(markdown, "## LeNet-5 on MNIST")
    assert_rows_show_required_keys(
        results, sections.MNIST_ROWS, metrics, contract.MNIST_REQUIRED_KEYS
    )
    # The settings of one run: the options that hold a value, none shown as n/a.
    config = metrics["config"]
    assert None in config.values(), "the run should leave an option unset (e.g. data_dir)"
    settings = table_after(markdown, "### Settings")
    assert set(settings) == {name for name, value in config.items() if value is not None}
    for name, (cell,) in settings.items():
        assert_cell_shows(cell, config[name], name)
    figures = embedded_figures(markdown)
    stem = mnist_pytorch_run.name
    assert {
        "mnist_loss.png",
        "mnist_accuracy.png",
        f"mnist_confusion_matrix_{stem}.png",
        f"mnist_feature_maps_{stem}.png",
    } <= set(figures)
    for name in figures:
        assert_png_not_blank(mnist_report_dir / name)


def test_overlay_of_runs(
    mnist_pytorch_run, mnist_lightning_run, mnist_report_dir, gpt_run_dir, tmp_path
):
    out = tmp_path / "report"
    run_dirs = [mnist_pytorch_run, mnist_lightning_run, gpt_run_dir]
    assert run_report([*map(str, run_dirs), "--out", str(out)]) == 0
    markdown = (out / build.REPORT_FILE).read_text()
    # One column per run of each kind, in the order given.
    results = table_after(markdown, "## LeNet-5 on MNIST")
    assert results[label_of(sections.MNIST_ROWS, "trainer")] == ["pytorch", "lightning"]
    metrics = [json.loads((d / contract.MNIST_METRICS_FILE).read_text()) for d in run_dirs[:2]]
    for run_metrics, cell in zip(
        metrics, results[label_of(sections.MNIST_ROWS, "test_accuracy")], strict=True
    ):
        assert_cell_shows(cell, run_metrics["test_accuracy"], "acc")
    # Settings: a table of the options that differ, one line naming those set alike.
    configs = [run_metrics["config"] for run_metrics in metrics]
    differing = [name for name in configs[0] if configs[0][name] != configs[1][name]]
    assert {"on_device_data", "max_steps"} <= set(differing)
    settings = table_after(markdown, "### Settings that differ between the runs")
    assert list(settings) == differing
    for name, cells in settings.items():
        for cell, config in zip(cells, configs, strict=True):
            assert_cell_shows(cell, config[name], name)
    alike_line = next(line for line in markdown.splitlines() if line.startswith("Alike in"))
    alike = [name for name in configs[0] if name not in differing and configs[0][name] is not None]
    assert re.findall(r"`(\w+)`", alike_line) == alike
    assert f"`epochs` {configs[0]['epochs']}," in alike_line
    gpt_results = table_after(markdown, "## GPT-2 pretraining")
    assert len(gpt_results[label_of(sections.GPT_ROWS, "final_loss")]) == 1
    # Shared curve figures, and a confusion matrix per run.
    for run_dir in run_dirs[:2]:
        assert f"mnist_confusion_matrix_{run_dir.name}.png" in embedded_figures(markdown)
    overlay = assert_png_not_blank(out / "mnist_loss.png")
    single = mpimg.imread(mnist_report_dir / "mnist_loss.png")
    assert overlay.shape == single.shape and not np.array_equal(overlay, single), (
        "the overlay must differ from the single run's figure (second curve and legend)"
    )
    assert "gpt_loss.png" in embedded_figures(markdown)


# ---------------------------------------------------------------- bad input


def test_missing_run_folder_is_an_input_error(tmp_path, capsys):
    assert run_report([str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "nope does not exist" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    with pytest.raises(InputError, match="is not a folder"):
        load_run(Path(__file__))


def test_existing_output_folder_needs_overwrite(mnist_pytorch_run, mnist_report_dir, capsys):
    assert run_report([str(mnist_pytorch_run), "--out", str(mnist_report_dir)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_overwrite_replaces_only_an_earlier_report(
    mnist_pytorch_run, mnist_report_dir, tmp_path, capsys
):
    run = tmp_path / "mnist_run"
    shutil.copytree(mnist_pytorch_run, run)
    files_before = sorted(run.rglob("*"))
    assert run_report([str(run), "--out", str(run), "--overwrite"]) == 2
    assert "is not a report" in capsys.readouterr().err
    assert sorted(run.rglob("*")) == files_before, "the run folder must stay as it was"

    earlier = tmp_path / "earlier_report"
    shutil.copytree(mnist_report_dir, earlier)
    (earlier / "stale.png").write_bytes(b"left over")
    assert run_report([str(run), "--out", str(earlier), "--overwrite"]) == 0
    assert not (earlier / "stale.png").exists()
    assert "mnist_run" in (earlier / build.REPORT_FILE).read_text()


def test_folder_without_anything_is_reported(tmp_path):
    empty = tmp_path / "empty_run"
    empty.mkdir()
    path = build.write_report([empty], tmp_path / "report")
    markdown = path.read_text()
    assert "no TensorBoard event files" in markdown
    assert f"no {contract.GPT_SUMMARY_FILE} or {contract.MNIST_METRICS_FILE}" in markdown
    assert "## Unrecognised folders" in markdown


@pytest.mark.system
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium not installed")
def test_no_screenshot_of_runs_without_scalars(tmp_path):
    empty = tmp_path / "empty_run"
    empty.mkdir()
    out = tmp_path / "report"
    assert run_report([str(empty), "--out", str(out), "--tensorboard-screenshot"]) == 1
    assert "no TensorBoard screenshot" in (out / build.REPORT_FILE).read_text()
    assert not (out / build.SCREENSHOT_FILE).exists()


def test_run_in_progress_is_reported_from_its_events(gpt_run_dir, tmp_path):
    # As the run looks while training: no summary yet, the newest event file cut mid-record.
    running = tmp_path / "gpt_running"
    shutil.copytree(gpt_run_dir, running)
    (running / contract.GPT_SUMMARY_FILE).unlink()
    event_file = max(find_event_dirs(running)[0].glob("*tfevents*"), key=lambda p: p.stat().st_size)
    data = event_file.read_bytes()
    event_file.write_bytes(data[: len(data) * 2 // 3])

    record = load_run(running)
    assert record.kind == "gpt", "the kind comes from the tags when no summary exists"
    assert len(record.scalars[contract.TRAIN_LOSS].values) >= 1
    path = build.write_report([running], tmp_path / "report")
    markdown = path.read_text()
    assert "unfinished" in markdown
    results = table_after(markdown, "## GPT-2 pretraining")
    assert results[label_of(sections.GPT_ROWS, "final_loss")] == ["n/a"]
    assert_png_not_blank(path.parent / "gpt_loss.png")


def copy_with_summary(run_dir: Path, copy: Path, edit) -> dict:
    """A copy of the run folder whose summary is `edit(summary)`, written as Python's json
    writes it (a NaN as a bare NaN); the summary written."""
    shutil.copytree(run_dir, copy)
    summary = edit(json.loads((run_dir / contract.GPT_SUMMARY_FILE).read_text()))
    (copy / contract.GPT_SUMMARY_FILE).write_text(json.dumps(summary))
    return summary


def as_version_2(summary: dict) -> dict:
    """The run's summary as a version-2 writer wrote it: the verdict said three times, no
    time budget, checkpoint saves, compile counts or token budget."""
    new_keys = ("time_budget", "checkpoint_saves", "compile", "token_budget")
    summary = {key: value for key, value in summary.items() if key not in new_keys}
    passed = summary["verdict"] == "pass"
    diverged = summary["verdict"] == "diverged"
    return {**summary, "summary_version": 2, "loss_below_threshold": passed, "diverged": diverged}


def as_version_3(summary: dict) -> dict:
    """The run's summary as version 3 writes it: the same run's times split into the parts of
    its wall time, two checkpoint saves, a compiled model, the token budget asked for."""
    summary = {k: v for k, v in summary.items() if k not in ("loss_below_threshold", "diverged")}
    wall, loop = summary["wall_seconds"], summary["train_loop_seconds"]
    first_step, outside_loop = summary["first_step_seconds"], wall - loop
    saves = [{"step": 6, "seconds": 0.1 * loop}, {"step": 12, "seconds": 0.05 * loop}]
    budget = {
        "imports": 0.3 * outside_loop,
        "data": 0.2 * outside_loop,
        "model": 0.1 * outside_loop,
        "trainer_setup": 0.1 * outside_loop,
        "first_step": first_step,
        "steps": loop - first_step - 0.15 * loop,
        "checkpoint_saves": 0.15 * loop,
        "final_save": 0.1 * outside_loop,
        "final_eval": 0.1 * outside_loop,
        "summary": None,
    }
    budget["other"] = wall - sum(value for value in budget.values() if value is not None)
    assert min(value for value in budget.values() if value is not None) > 0
    return {
        **summary,
        "summary_version": 3,
        "time_budget": budget,
        "checkpoint_saves": saves,
        "compile": {"compiles": 1, "recompiles": 0},
        "token_budget": summary["tokens_trained"],
    }


def test_summary_of_version_2_is_reported_with_a_note(gpt_run_dir, tmp_path):
    old = tmp_path / "gpt_v2"
    summary = copy_with_summary(gpt_run_dir, old, as_version_2)
    markdown = build.write_report([old], tmp_path / "report").read_text()
    assert "summary_version 2, this checkout reads 3" in markdown
    results = table_after(markdown, "## GPT-2 pretraining")
    assert results[label_of(sections.GPT_ROWS, "verdict")] == [summary["verdict"]]
    for key in ("checkpoint_saves", "compile", "token_budget"):
        assert results[label_of(sections.GPT_ROWS, key)] == ["n/a"], key
    assert sections.TIME_BUDGET_FIGURE not in markdown


def test_time_budget_of_version_3_is_drawn_and_adds_up(gpt_run_dir, tmp_path):
    run = tmp_path / "gpt_v3"
    summary = copy_with_summary(gpt_run_dir, run, as_version_3)
    copy_with_summary(gpt_run_dir, tmp_path / "gpt_v2", as_version_2)
    out = tmp_path / "report"
    # Beside a run without a time budget, which gets no bar and no column.
    markdown = build.write_report([run, tmp_path / "gpt_v2"], out).read_text()
    notes = markdown.split("## Notes")[1].split("\n## ")[0]
    assert "`gpt_v3`" not in notes, "a version-3 summary needs no note"
    assert sections.TIME_BUDGET_FIGURE in embedded_figures(markdown)
    assert_png_not_blank(out / sections.TIME_BUDGET_FIGURE)
    budget = table_after(markdown, sections.TIME_BUDGET_FIGURE)
    parts = [part for part, value in summary["time_budget"].items() if value is not None]
    assert list(budget) == parts, "in the order of the run's wall time, the null part left out"
    assert all(len(cells) == 1 for cells in budget.values())
    shown_total = sum(float(cells[0].replace(",", "")) for cells in budget.values())
    assert math.isclose(shown_total, summary["wall_seconds"], rel_tol=1e-3)

    results = table_after(markdown, "## GPT-2 pretraining")
    saves_cell, _ = results[label_of(sections.GPT_ROWS, "checkpoint_saves")]
    count, seconds = saves_cell.split(", ")
    assert count == "2"
    assert_cell_shows(seconds, sum(save["seconds"] for save in summary["checkpoint_saves"]), "s")
    assert results[label_of(sections.GPT_ROWS, "compile")][0] == "1, 0"
    assert_cell_shows(results[label_of(sections.GPT_ROWS, "token_budget")][0],
                      summary["token_budget"], "token_budget")  # fmt: skip


def test_nan_in_a_summary_is_refused_in_one_line(gpt_run_dir, tmp_path):
    # A summary written with Python's default json.dumps: a NaN loss as a bare NaN, which a
    # lenient reader takes for a float that, with the stored verdict, reads as a pass.
    broken = tmp_path / "gpt_nan"
    copy_with_summary(gpt_run_dir, broken, lambda s: {**s, "final_loss": math.nan})
    with pytest.raises(InputError) as refused:
        contract.read_gpt_summary(broken)
    message = str(refused.value)
    assert "\n" not in message and str(broken / contract.GPT_SUMMARY_FILE) in message
    assert "NaN" in message

    markdown = build.write_report([broken], tmp_path / "report").read_text()
    assert f"{contract.GPT_SUMMARY_FILE} is not valid JSON" in markdown
    results = table_after(markdown, "## GPT-2 pretraining")
    assert results[label_of(sections.GPT_ROWS, "verdict")] == ["n/a"]


def test_newer_summary_is_refused_and_missing_keys_noted(gpt_run_dir, tmp_path):
    newer = tmp_path / "gpt_newer"
    copy_with_summary(gpt_run_dir, newer, lambda s: {**s, "summary_version": 99})
    with pytest.raises(InputError, match="summary_version 99, newer than the 3 this checkout"):
        contract.read_gpt_summary(newer / contract.GPT_SUMMARY_FILE)

    old = tmp_path / "gpt_old"
    summary = copy_with_summary(gpt_run_dir, old, as_version_2)
    del summary["mfu"], summary["speed_settings"]
    (old / contract.GPT_SUMMARY_FILE).write_text(json.dumps(summary))
    markdown = build.write_report([newer, old], tmp_path / "report").read_text()
    assert "update the toolkit to read it; its numbers are left out" in markdown
    assert "lacks mfu, speed_settings" in markdown
    results = table_after(markdown, "## GPT-2 pretraining")
    assert results[label_of(sections.GPT_ROWS, "mfu")] == ["n/a", "n/a"]
    assert_cell_shows(
        results[label_of(sections.GPT_ROWS, "tokens_trained")][1],
        summary["tokens_trained"],
        "tokens",
    )


def test_folder_of_a_running_run_says_running(gpt_run_dir, tmp_path):
    running = tmp_path / "gpt_running"
    shutil.copytree(gpt_run_dir, running)
    (running / contract.GPT_SUMMARY_FILE).unlink()
    # The lock as pretraining holds it (another open file of the same path conflicts as
    # another process's would).
    with exclusive_lock(running / LOCK_FILE, wait=False):
        markdown = build.write_report([running], tmp_path / "report").read_text()
    assert f"running (process {os.getpid()} on {socket.gethostname()})" in markdown
    assert "unfinished" not in markdown and "stale" not in markdown


def test_lock_left_by_a_killed_run_is_said_to_be_stale(gpt_run_dir, tmp_path):
    killed = tmp_path / "gpt_killed"
    shutil.copytree(gpt_run_dir, killed)
    (killed / contract.GPT_SUMMARY_FILE).unlink()
    # A run killed with SIGKILL while it holds the lock: the file stays, nobody holds it.
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from common.files import exclusive_lock\n"
        "with exclusive_lock(Path(sys.argv[1]), wait=False):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(killed / LOCK_FILE)], cwd=REPO_ROOT)
    holder = (killed / LOCK_FILE).read_text().strip()
    assert holder.startswith("process ")

    markdown = build.write_report([killed], tmp_path / "report").read_text()
    assert f"{LOCK_FILE} is stale: {holder}" in markdown
    assert "unfinished" in markdown and "running (" not in markdown


def test_unreadable_summary_is_reported(mnist_pytorch_run, tmp_path):
    broken = tmp_path / "mnist_broken"
    shutil.copytree(mnist_pytorch_run, broken)
    (broken / contract.MNIST_METRICS_FILE).write_text('{"test_accuracy": 0.9')
    markdown = build.write_report([broken], tmp_path / "report").read_text()
    assert f"{contract.MNIST_METRICS_FILE} is not valid JSON" in markdown
    assert "mnist_loss.png" in embedded_figures(markdown)


# ---------------------------------------------------------------- what the report depends on


@pytest.mark.slow
def test_the_report_runs_without_torch(mnist_pytorch_run, tmp_path):
    # In a fresh interpreter: the test process itself has imported torch long ago.
    out = tmp_path / "report"
    script = (
        "import sys\n"
        "from report.__main__ import main\n"
        f"assert main([{str(mnist_pytorch_run)!r}, '--out', {str(out)!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'the report imported torch'\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mnist_loss.png" in embedded_figures((out / build.REPORT_FILE).read_text())


def string_literals(path: Path) -> list[str]:
    """The string constants of a module, docstrings left out (they may name files in prose)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    ]


def test_the_report_spells_no_file_name_or_tag_of_the_contract():
    names = {
        value
        for key, value in vars(contract).items()
        if key.isupper() and isinstance(value, str) and ("/" in value or "." in value)
    }
    assert {contract.GPT_SUMMARY_FILE, contract.TRAIN_LOSS, contract.MFU} <= names
    for path in sorted((REPO_ROOT / "report").glob("*.py")):
        spelled = {name for text in string_literals(path) for name in names if name in text}
        assert not spelled, f"{path.name} spells {sorted(spelled)}: import them from the contract"


# ---------------------------------------------------------------- TensorBoard in a real browser


@pytest.mark.system
@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="Chromium not installed (.ci/install_chromium.sh installs it)",
)
def test_tensorboard_screenshot_shows_scalar_charts(mnist_pytorch_run, tmp_path):
    out = tmp_path / "report"
    exit_code = run_report([str(mnist_pytorch_run), "--out", str(out), "--tensorboard-screenshot"])
    assert exit_code == 0
    assert build.SCREENSHOT_FILE in embedded_figures((out / build.REPORT_FILE).read_text())
    pixels = assert_png_not_blank(out / build.SCREENSHOT_FILE)
    rgb = (pixels[..., :3] * 255).astype(int)
    # The curves of the first run are drawn in TensorBoard's orange; the empty "No dashboards
    # are active" page has none right of the run selector and below the toolbar.
    chart_area = rgb[150:, 400:]
    red, green, blue = chart_area[..., 0], chart_area[..., 1], chart_area[..., 2]
    curve_pixels = (red > 200) & (green > 60) & (green < 170) & (blue < 120)
    assert curve_pixels.sum() > 200, "no scalar chart drawn in the screenshot"
