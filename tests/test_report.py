"""The run report (common.report) on real tiny runs of both stages, and on damaged run folders."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

from common import report
from common.cli import InputError
from common.run_folder import SUMMARY_FILES, find_event_dirs, load_run

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
def gpt_report_dir(gpt_run_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "gpt"
    assert report.main([str(gpt_run_dir), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def mnist_report_dir(mnist_pytorch_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "mnist"
    assert report.main([str(mnist_pytorch_run), "--out", str(out)]) == 0
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


# ---------------------------------------------------------------- reports of real runs


def test_gpt_report_numbers_equal_the_summary(gpt_run_dir, gpt_report_dir):
    summary = json.loads((gpt_run_dir / "run_summary.json").read_text())
    markdown = (gpt_report_dir / "report.md").read_text()
    results = table_after(markdown, "## GPT-2 pretraining")
    for key in (
        "wall_seconds",
        "train_loop_seconds",
        "tokens_trained",
        "tokens_per_second",
        "mfu",
        "final_loss",
        "final_loss_window",
        "loss_threshold",
        "loss_below_threshold",
        "eval_loss",
        "perplexity",
        "max_steps",
        "global_batch_tokens",
        "num_parameters",
    ):
        (cell,) = results[label_of(report.GPT_ROWS, key)]
        assert_cell_shows(cell, summary[key], key)
    (pass_cell,) = results[label_of(report.GPT_ROWS, "loss_below_threshold")]
    assert pass_cell == ("pass" if summary["final_loss"] < summary["loss_threshold"] else "fail")

    speed = table_after(markdown, "### Speed settings in force")
    assert set(speed) == set(summary["speed_settings"])
    for name, value in summary["speed_settings"].items():
        assert_cell_shows(speed[name][0], value, name)
    versions = table_after(markdown, "### Library versions")
    assert versions["torch"] == [summary["versions"]["torch"]]


def test_gpt_report_figures(gpt_run_dir, gpt_report_dir):
    markdown = (gpt_report_dir / "report.md").read_text()
    figures = embedded_figures(markdown)
    assert {"gpt_loss.png", "gpt_learning_rate.png", "gpt_throughput.png"} <= set(figures)
    for name in figures:
        assert_png_not_blank(gpt_report_dir / name)
    # GPU curves only when the run sampled a GPU (not on a CPU test machine).
    assert ("gpt_gpu.png" in figures) == (
        "gpu/utilization_percent" in load_run(gpt_run_dir).scalars
    )
    assert "Notes" not in markdown, "a finished run needs no notes"


def test_gpu_samples_and_nvidia_smi_snapshot_are_reported(gpt_run_dir, tmp_path):
    # What a GPU run adds: the NVML sampler's tags (written here as the sampler writes them,
    # a CPU test has no GPU to sample) and the nvidia-smi snapshot.
    from torch.utils.tensorboard import SummaryWriter

    gpu_run = tmp_path / "gpt_gpu"
    shutil.copytree(gpt_run_dir, gpu_run)
    with SummaryWriter(str(gpu_run / "tensorboard")) as writer:
        for step in range(1, 13):
            writer.add_scalar("gpu/utilization_percent", 90.0 + step % 3, step)
            writer.add_scalar("gpu/memory_used_gib", 20.0 + step / 10, step)
            writer.add_scalar("gpu/power_watts", 400.0 + step, step)
    snapshot = "| NVIDIA-SMI 580.65  Driver Version: 580.65 |\n|  0  NVIDIA H200  95% |\n"
    (gpu_run / "nvidia-smi.txt").write_text(snapshot)

    out = tmp_path / "report"
    markdown = report.write_report([gpu_run], out).read_text()
    assert "gpt_gpu.png" in embedded_figures(markdown)
    assert_png_not_blank(out / "gpt_gpu.png")
    assert snapshot.strip() in markdown


def test_mnist_report_numbers_and_figures(mnist_pytorch_run, mnist_report_dir):
    metrics = json.loads((mnist_pytorch_run / "metrics.json").read_text())
    markdown = (mnist_report_dir / "report.md").read_text()
    results = table_after(markdown, "## LeNet-5 on MNIST")
    for key in ("test_accuracy", "test_loss", "epochs", "train_seconds", "num_train", "num_test"):
        (cell,) = results[label_of(report.MNIST_ROWS, key)]
        assert_cell_shows(cell, metrics[key], key)
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
    assert report.main([*map(str, run_dirs), "--out", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    # One column per run of each kind, in the order given.
    results = table_after(markdown, "## LeNet-5 on MNIST")
    assert results[label_of(report.MNIST_ROWS, "trainer")] == ["pytorch", "lightning"]
    for run_dir, cell in zip(
        run_dirs[:2], results[label_of(report.MNIST_ROWS, "test_accuracy")], strict=True
    ):
        assert_cell_shows(
            cell, json.loads((run_dir / "metrics.json").read_text())["test_accuracy"], "acc"
        )
    gpt_results = table_after(markdown, "## GPT-2 pretraining")
    assert len(gpt_results[label_of(report.GPT_ROWS, "final_loss")]) == 1
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
    assert report.main([str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "nope does not exist" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    with pytest.raises(InputError, match="is not a folder"):
        load_run(Path(__file__))


def test_existing_output_folder_needs_overwrite(mnist_pytorch_run, mnist_report_dir, capsys):
    assert report.main([str(mnist_pytorch_run), "--out", str(mnist_report_dir)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_folder_without_anything_is_reported(tmp_path):
    empty = tmp_path / "empty_run"
    empty.mkdir()
    path = report.write_report([empty], tmp_path / "report")
    markdown = path.read_text()
    assert "no TensorBoard event files" in markdown
    assert "no run_summary.json or metrics.json" in markdown
    assert "## Unrecognised folders" in markdown


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium not installed")
def test_no_screenshot_of_runs_without_scalars(tmp_path):
    empty = tmp_path / "empty_run"
    empty.mkdir()
    out = tmp_path / "report"
    assert report.main([str(empty), "--out", str(out), "--tensorboard-screenshot"]) == 1
    assert "no TensorBoard screenshot" in (out / "report.md").read_text()
    assert not (out / report.SCREENSHOT_FILE).exists()


def test_run_in_progress_is_reported_from_its_events(gpt_run_dir, tmp_path):
    # As the run looks while training: no summary yet, the newest event file cut mid-record.
    running = tmp_path / "gpt_running"
    shutil.copytree(gpt_run_dir, running)
    (running / SUMMARY_FILES["gpt"]).unlink()
    event_file = max(find_event_dirs(running)[0].glob("*tfevents*"), key=lambda p: p.stat().st_size)
    data = event_file.read_bytes()
    event_file.write_bytes(data[: len(data) * 2 // 3])

    record = load_run(running)
    assert record.kind == "gpt", "the kind comes from the tags when no summary exists"
    assert len(record.scalars["train/loss"].values) >= 1
    path = report.write_report([running], tmp_path / "report")
    markdown = path.read_text()
    assert "unfinished" in markdown
    results = table_after(markdown, "## GPT-2 pretraining")
    assert results[label_of(report.GPT_ROWS, "final_loss")] == ["n/a"]
    assert_png_not_blank(path.parent / "gpt_loss.png")


def test_older_summary_version_and_missing_keys(gpt_run_dir, tmp_path):
    old = tmp_path / "gpt_old"
    shutil.copytree(gpt_run_dir, old)
    summary_path = old / SUMMARY_FILES["gpt"]
    summary = json.loads(summary_path.read_text())
    summary["summary_version"] = 0
    del summary["mfu"], summary["speed_settings"]
    summary_path.write_text(json.dumps(summary))

    markdown = report.write_report([old], tmp_path / "report").read_text()
    assert "summary_version 0" in markdown
    assert "lacks mfu, speed_settings" in markdown
    results = table_after(markdown, "## GPT-2 pretraining")
    assert results[label_of(report.GPT_ROWS, "mfu")] == ["n/a"]
    assert_cell_shows(
        results[label_of(report.GPT_ROWS, "tokens_trained")][0], summary["tokens_trained"], "tokens"
    )


def test_unreadable_summary_is_reported(mnist_pytorch_run, tmp_path):
    broken = tmp_path / "mnist_broken"
    shutil.copytree(mnist_pytorch_run, broken)
    (broken / SUMMARY_FILES["mnist"]).write_text('{"test_accuracy": 0.9')
    markdown = report.write_report([broken], tmp_path / "report").read_text()
    assert "metrics.json is not valid JSON" in markdown
    assert "mnist_loss.png" in embedded_figures(markdown)


# ---------------------------------------------------------------- TensorBoard in a real browser


@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="Chromium not installed (.ci/install_chromium.sh installs it)",
)
def test_tensorboard_screenshot_shows_scalar_charts(mnist_pytorch_run, tmp_path):
    out = tmp_path / "report"
    exit_code = report.main([str(mnist_pytorch_run), "--out", str(out), "--tensorboard-screenshot"])
    assert exit_code == 0
    assert report.SCREENSHOT_FILE in embedded_figures((out / "report.md").read_text())
    pixels = assert_png_not_blank(out / report.SCREENSHOT_FILE)
    rgb = (pixels[..., :3] * 255).astype(int)
    # The curves of the first run are drawn in TensorBoard's orange; the empty "No dashboards
    # are active" page has none right of the run selector and below the toolbar.
    chart_area = rgb[150:, 400:]
    red, green, blue = chart_area[..., 0], chart_area[..., 1], chart_area[..., 2]
    curve_pixels = (red > 200) & (green > 60) & (green < 170) & (blue < 120)
    assert curve_pixels.sum() > 200, "no scalar chart drawn in the screenshot"
