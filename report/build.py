"""Build the report: figures and report.md from one or more run folders.

Works for GPT pretraining runs (with their classification probe's results when they were
probed), LeNet-5 runs and parallelism comparisons (told apart by their summary file, see
`common/run_contract.py`), and for a mix of them; runs of the same kind are overlaid in one set
of figures (legend = run folder). Unfinished or older runs are reported with what they hold
and a note of what is missing.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import run_contract as contract
from common.cli import InputError
from common.files import atomic_dir
from report.plots import (
    Curve,
    Panel,
    plot_confusion_matrix,
    plot_images,
    plot_panels,
    plot_probe_curves,
)
from report.run_folder import (
    COMPARISON_KIND,
    GPT_KIND,
    MNIST_KIND,
    UNKNOWN_KIND,
    RunRecord,
    file_stem,
    load_run,
    unique_run_names,
)
from report.tensorboard_screenshot import ScreenshotError, find_chromium, screenshot_tensorboard

logger = logging.getLogger(__name__)

REPORT_FILE = "report.md"
SCREENSHOT_FILE = "tensorboard_scalars.png"
DEFAULT_LOSS_THRESHOLD = 7.0
SIGNIFICANT_DIGITS = 4
MISSING = "n/a"
NO_PEAK_FLOPS = "no peak FLOP/s known for this device"


# ---------------------------------------------------------------- number formatting


def format_number(value: float | int) -> str:
    """Integers in full; floats to 4 significant digits without trailing zeros or exponent."""
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    decimals = max(0, SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_value(value: Any) -> str:
    """A summary value as one Markdown table cell."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return format_number(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return " ".join(text.split()).replace("|", "\\|")


def format_hardware(hardware: Any) -> str:
    """One line: the GPUs when there were any, else the CPU."""
    if not isinstance(hardware, dict):
        return format_value(hardware)
    gpus = hardware.get("gpus")
    if isinstance(gpus, list) and gpus and all(isinstance(gpu, dict) for gpu in gpus):
        counts = Counter(
            f"{gpu.get('name', '?')} ({gpu.get('memory_gib', '?')} GiB)" for gpu in gpus
        )
        return format_value(", ".join(f"{n} x {name}" for name, n in counts.items()))
    if "cpu" not in hardware:
        return format_value(hardware)
    return format_value(f"CPU {hardware['cpu']}, {hardware.get('cpu_count', '?')} cores")


@dataclass(frozen=True)
class Row:
    """A table row: a label and the summary key it shows."""

    label: str
    key: str
    formatter: Callable[[Any], str] = format_value


GPT_ROWS = (
    Row("wall time, launch to end (s)", "wall_seconds"),
    Row("training loop (s)", "train_loop_seconds"),
    Row("tokens trained", "tokens_trained"),
    Row("tokens/s", "tokens_per_second"),
    Row("MFU (fraction of peak)", "mfu"),
    Row("final loss (mean of the last logged steps)", "final_loss"),
    Row("logged steps in the final loss", "final_loss_window"),
    Row("loss threshold", "loss_threshold"),
    Row("verdict: pass (final loss below the threshold), fail, or diverged", "verdict"),
    Row("diverged at step (loss, gradient or weights NaN or infinite)", "diverged_at_step"),
    Row("validation loss", "eval_loss"),
    Row("validation perplexity", "perplexity"),
    Row("validation bits per byte", "bits_per_byte"),
    Row("optimizer steps planned", "max_steps"),
    Row("optimizer steps done", "global_step"),
    Row("processes", "num_processes"),
    Row("tokens per optimizer step", "global_batch_tokens"),
    Row("parameters", "num_parameters"),
    Row("hardware", "hardware", format_hardware),
)

MNIST_ROWS = (
    Row("trainer", "trainer"),
    Row("test accuracy (fraction)", "test_accuracy"),
    Row("test loss", "test_loss"),
    Row("epochs", "epochs"),
    Row("training time (s)", "train_seconds"),
    Row("training digits", "num_train"),
    Row("validation digits", "num_val"),
    Row("test digits", "num_test"),
    Row("test digits also in the training set", "num_test_in_train"),
    Row("data", "data_source"),
    Row("device", "device"),
    Row("hardware", "hardware", format_hardware),
)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def summary_table(runs: Sequence[RunRecord], rows: Sequence[Row]) -> list[str]:
    """One column per run, one row per summary value."""
    body = [
        [row.label]
        + [
            row.formatter(run.summary[row.key]) if row.key in run.summary else MISSING
            for run in runs
        ]
        for row in rows
    ]
    return markdown_table(["", *(f"`{run.name}`" for run in runs)], body)


def summary_mappings(runs: Sequence[RunRecord], key: str) -> list[dict[str, Any]]:
    """The dict-valued summary entry `key` of each run ({} where a run lacks it)."""
    return [run.summary.get(key) if isinstance(run.summary.get(key), dict) else {} for run in runs]


def mapping_table(
    runs: Sequence[RunRecord], mappings: Sequence[dict[str, Any]], names: Sequence[str]
) -> list[str]:
    """One row per name, one column per run; [] when there are no names."""
    if not names:
        return []
    body = [
        [name]
        + [format_value(mapping[name]) if name in mapping else MISSING for mapping in mappings]
        for name in names
    ]
    return markdown_table(["", *(f"`{run.name}`" for run in runs)], body)


def mapping_section(runs: Sequence[RunRecord], key: str, heading: str) -> list[str]:
    """Every entry of a dict-valued summary key (union over runs); [] when no run has one."""
    mappings = summary_mappings(runs, key)
    names = list(dict.fromkeys(name for mapping in mappings for name in mapping))
    table = mapping_table(runs, mappings, names)
    return [heading, "", *table, ""] if table else []


def settings_section(runs: Sequence[RunRecord]) -> list[str]:
    """The options in the summaries' `config`: of one run those that hold a value; of several,
    those that differ between them in a table and those alike in one line."""
    mappings = summary_mappings(runs, "config")
    names = list(dict.fromkeys(name for mapping in mappings for name in mapping))
    if len(runs) == 1:
        shown = [name for name in names if mappings[0][name] is not None]
        table = mapping_table(runs, mappings, shown)
        return ["### Settings", "", *table, ""] if table else []
    absent = object()  # an option a run's summary does not hold differs from every value
    differing, alike = [], []
    for name in names:
        values = [mapping.get(name, absent) for mapping in mappings]
        if any(value != values[0] for value in values[1:]):
            differing.append(name)
        elif values[0] is not None:
            alike.append(name)
    if not differing and not alike:
        return []
    lines = ["### Settings that differ between the runs", ""]
    lines += mapping_table(runs, mappings, differing) or ["None."]
    if alike:
        shared = ", ".join(f"`{name}` {format_value(mappings[0][name])}" for name in alike)
        lines += ["", f"Alike in every run: {shared}."]
    return [*lines, ""]


# ---------------------------------------------------------------- figures

# A curve figure: file name, caption, panels.
FigureSpec = tuple[str, str, tuple[Panel, ...]]

GPU_CAPTION = "GPU utilisation, memory and power over time (NVML samples)"
GPU_PANELS = (
    Panel("GPU utilisation", "%", (Curve(contract.GPU_UTILIZATION),), time_axis=True),
    Panel("GPU memory in use", "GiB", (Curve(contract.GPU_MEMORY_USED),), time_axis=True),
    Panel("GPU power", "W", (Curve(contract.GPU_POWER),), time_axis=True),
)


def gpt_figures(runs: Sequence[RunRecord]) -> list[FigureSpec]:
    """The pretraining figures; the threshold line is the runs' own (the course's 7 by default)."""
    threshold = next(
        (
            r.summary["loss_threshold"]
            for r in runs
            if isinstance(r.summary.get("loss_threshold"), int | float)
        ),
        DEFAULT_LOSS_THRESHOLD,
    )
    return [
        (
            "gpt_loss.png",
            "Training loss (faint: per logged step; solid: smoothed) and validation loss",
            (
                Panel(
                    "training loss",
                    "cross-entropy (nats/token)",
                    (
                        Curve(contract.TRAIN_LOSS, "training", smoothed=True),
                        Curve(contract.EVAL_LOSS, "validation", style="--", marker="s"),
                    ),
                    hline=threshold,
                    hline_label=f"loss = {threshold:g}",
                ),
            ),
        ),
        (
            "gpt_learning_rate.png",
            "Learning rate schedule and gradient norm",
            (
                Panel("learning rate", "learning rate", (Curve(contract.LEARNING_RATE),)),
                Panel(
                    "gradient norm", "global L2 norm", (Curve(contract.GRAD_NORM, smoothed=True),)
                ),
            ),
        ),
        (
            "gpt_throughput.png",
            "Throughput: tokens per second and, where the peak FLOP/s is known, model FLOPs "
            "utilisation",
            (
                Panel("tokens/s", "tokens per second", (Curve(contract.TOKENS_PER_SECOND),)),
                Panel("MFU", "fraction of peak FLOP/s", (Curve(contract.MFU),)),
            ),
        ),
        ("gpt_gpu.png", GPU_CAPTION, GPU_PANELS),
    ]


def mnist_metric_figure(metric: str, step_tag: str, epoch_tag: str, val_tag: str) -> FigureSpec:
    """Loss or accuracy of LeNet-5: per logged step, and per epoch for training and validation."""
    return (
        f"mnist_{metric}.png",
        f"LeNet-5 {metric}: per logged step while training; per epoch on the training and "
        "validation sets, at the step each epoch ended",
        (
            Panel(f"{metric} per step", metric, (Curve(step_tag, smoothed=True),)),
            Panel(
                f"{metric} per epoch",
                metric,
                (
                    Curve(epoch_tag, "train", marker="o"),
                    Curve(val_tag, "validation", style="--", marker="s"),
                ),
            ),
        ),
    )


MNIST_FIGURES: list[FigureSpec] = [
    mnist_metric_figure("loss", contract.TRAIN_LOSS, contract.EPOCH_TRAIN_LOSS, contract.VAL_LOSS),
    mnist_metric_figure("accuracy", contract.TRAIN_ACC, contract.EPOCH_TRAIN_ACC, contract.VAL_ACC),
    (
        "mnist_learning_rate.png",
        "Learning rate",
        (Panel("learning rate", "learning rate", (Curve(contract.LEARNING_RATE),)),),
    ),
    ("mnist_gpu.png", GPU_CAPTION, GPU_PANELS),
]


def figure_lines(path: Path, caption: str) -> list[str]:
    return [f"![{caption}]({path.name})", "", f"*{caption}*", ""]


def curve_section(
    runs: Sequence[RunRecord], figures: Sequence[FigureSpec], out_dir: Path
) -> list[str]:
    lines: list[str] = []
    for file_name, caption, panels in figures:
        path = out_dir / file_name
        if plot_panels(runs, panels, path):
            lines += figure_lines(path, caption)
    return lines


# ---------------------------------------------------------------- sections


def notes_section(runs: Sequence[RunRecord], extra_notes: Sequence[str]) -> list[str]:
    items = [f"- `{run.name}`: {note}" for run in runs for note in run.notes]
    items += [f"- {note}" for note in extra_notes]
    return ["## Notes", "", *items, ""] if items else []


def nvidia_smi_lines(runs: Sequence[RunRecord]) -> list[str]:
    lines: list[str] = []
    for run in runs:
        if run.nvidia_smi:
            lines += [
                f"### nvidia-smi during `{run.name}`",
                "",
                "```text",
                run.nvidia_smi.rstrip(),
                "```",
                "",
            ]
    return lines


def no_mfu_lines(runs: Sequence[RunRecord]) -> list[str]:
    """Why a run has no MFU: the run knew no peak FLOP/s to divide by (a CPU, an unlisted GPU)."""
    lines = [
        f"MFU of `{run.name}`: not shown, {NO_PEAK_FLOPS} (`--peak_tflops` of the run sets one)."
        for run in runs
        if contract.MFU not in run.scalars and run.summary.get("mfu") is None
    ]
    return [*lines, ""] if lines else []


PROBE_CURVE_FIGURE = "gpt_probe_curve.png"
PROBE_CURVE_CAPTION = (
    "When the representation starts to know the classes: the linear probe's test accuracy on "
    "the frozen network at step 0, at each saved checkpoint and at the end (right), beside the "
    "training loss (left), both against pretraining tokens"
)
PROBE_COLUMNS = (
    ("test accuracy", "accuracy"),
    ("macro-F1", "macro_f1"),
    ("accuracy on test texts pretraining did not train on", "accuracy_unseen_by_pretraining"),
    ("training (s)", "train_seconds"),
)


def probe_section(run: RunRecord, out_dir: Path) -> list[str]:
    """Per label level the run was probed on: the classifiers' scores beside chance, the
    overlap with the pretraining split, and the fine-tuned model's confusion matrix."""
    lines: list[str] = []
    for level, results in run.probes.items():
        methods = results["methods"] if isinstance(results["methods"], dict) else {}
        chance = results["chance"] if isinstance(results["chance"], dict) else {}
        class_names = results["class_names"]
        lines += [
            f"### Classification probe of `{run.name}`: {level}",
            "",
            f"{format_value(len(class_names))} classes; {format_value(results['num_train'])} "
            f"training and {format_value(results['num_test'])} test documents "
            f"({format_value(results.get('corpus'))}).",
            "",
        ]
        body = [
            [f"`{method}`", format_value(scores.get("description"))]
            + [format_value(scores.get(key)) for _, key in PROBE_COLUMNS]
            for method, scores in methods.items()
        ]
        body.append(
            ["chance", "always the most frequent training class"]
            + [format_value(chance.get("majority_class_accuracy"))]
            + [MISSING] * (len(PROBE_COLUMNS) - 1)
        )
        lines += markdown_table(["", "classifier", *(label for label, _ in PROBE_COLUMNS)], body)
        effect = results.get("pretraining_effect")
        if isinstance(effect, dict) and effect.get("verdict"):
            lines += ["", f"What pretraining bought: {format_value(effect['verdict'])}"]
        overlap = results["pretraining_overlap"]
        if isinstance(overlap, dict) and overlap.get("verdict"):
            lines += ["", f"Overlap with pretraining: {format_value(overlap['verdict'])}"]
        lines.append("")
        matrix = methods.get(contract.PROBE_PRETRAINED, {}).get("confusion_matrix")
        path = out_dir / f"gpt_probe_confusion_matrix_{file_stem(run.name)}_{file_stem(level)}.png"
        title = f"{run.name}, {level}: fine-tuned, test split"
        if matrix is not None and plot_confusion_matrix(matrix, title, path, class_names, level):
            lines += figure_lines(
                path, f"Confusion matrix of `{run.name}` fine-tuned on the {level} labels"
            )
    return lines


def gpt_section(runs: Sequence[RunRecord], out_dir: Path) -> list[str]:
    lines = ["## GPT-2 pretraining", "", "### Results", "", *summary_table(runs, GPT_ROWS), ""]
    for run in runs:
        lines += probe_section(run, out_dir)
    lines += mapping_section(runs, "speed_settings", "### Speed settings in force")
    loss_figure, *other_figures = gpt_figures(runs)
    lines += ["### Curves", "", *curve_section(runs, [loss_figure], out_dir)]
    probe_curve_path = out_dir / PROBE_CURVE_FIGURE
    if plot_probe_curves(runs, probe_curve_path):
        lines += figure_lines(probe_curve_path, PROBE_CURVE_CAPTION)
    lines += curve_section(runs, other_figures, out_dir)
    lines += no_mfu_lines(runs)
    lines += mapping_section(runs, "versions", "### Library versions")
    for run in runs:
        if run.summary.get("accelerator_state"):
            state = str(run.summary["accelerator_state"]).rstrip()
            lines += [f"### Accelerator state of `{run.name}`", "", "```text", state, "```", ""]
    return lines + nvidia_smi_lines(runs)


def mnist_section(runs: Sequence[RunRecord], out_dir: Path) -> list[str]:
    lines = ["## LeNet-5 on MNIST", "", "### Results", "", *summary_table(runs, MNIST_ROWS), ""]
    lines += settings_section(runs)
    lines += ["### Curves", "", *curve_section(runs, MNIST_FIGURES, out_dir)]
    for run in runs:
        stem = file_stem(run.name)
        matrix = run.summary.get("confusion_matrix")
        path = out_dir / f"mnist_confusion_matrix_{stem}.png"
        if matrix is not None and plot_confusion_matrix(matrix, f"{run.name}: test set", path):
            lines += figure_lines(path, f"Confusion matrix of `{run.name}` on the test digits")
        path = out_dir / f"mnist_feature_maps_{stem}.png"
        feature_map_tags = sorted(
            tag for tag in run.images if tag.startswith(contract.FEATURE_MAPS_PREFIX)
        )
        if plot_images(run, feature_map_tags, path):
            lines += figure_lines(path, f"Feature maps of `{run.name}` for fixed test digits")
    lines += mapping_section(runs, "versions", "### Library versions")
    return lines + nvidia_smi_lines(runs)


def comparison_section(runs: Sequence[RunRecord], out_dir: Path) -> list[str]:
    """Each comparison's table and figure, as compare-parallelism wrote them."""
    lines = ["## Parallelism comparison", ""]
    for run in runs:
        lines += [f"### `{run.name}`", "", f"`{run.summary.get('command', MISSING)}`", ""]
        table = run.path / contract.PARALLELISM_COMPARISON_TABLE
        if table.is_file():
            lines += [table.read_text(encoding="utf-8").rstrip(), ""]
        figure = run.path / contract.PARALLELISM_COMPARISON_FIGURE
        if figure.is_file():
            copy = out_dir / f"parallelism_comparison_{file_stem(run.name)}.png"
            shutil.copyfile(figure, copy)
            lines += figure_lines(
                copy, f"Memory per process and speed of each strategy in `{run.name}`"
            )
    return lines + mapping_section(runs, "versions", "### Library versions")


def unknown_section(runs: Sequence[RunRecord]) -> list[str]:
    lines = ["## Unrecognised folders", ""]
    for run in runs:
        tags = sorted(run.scalars) + sorted(run.images)
        found = ", ".join(f"`{tag}`" for tag in tags) if tags else "nothing"
        lines.append(f"- `{run.name}` ({display_path(run.path)}): logged {found}")
    return [*lines, ""]


# ---------------------------------------------------------------- the report


def display_path(path: Path) -> str:
    """A run folder as the reader would type it: relative to the working folder when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def is_previous_report(path: Path) -> bool:
    """Whether --overwrite may replace `path`: an earlier report or an empty folder, never a
    run folder or anything else that happens to have the name."""
    return path.is_dir() and ((path / REPORT_FILE).is_file() or not any(path.iterdir()))


def write_report(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path,
    overwrite: bool = False,
    tensorboard_screenshot: bool = False,
    chromium: str | None = None,
) -> Path:
    """Read the runs, write figures and report.md into `out_dir`; return the report's path."""
    if not run_dirs:
        raise InputError("no run folder given; pass one or more run folders")
    if tensorboard_screenshot:
        chromium = find_chromium(chromium)
    out_dir = Path(out_dir)
    if overwrite and out_dir.exists() and not is_previous_report(out_dir):
        raise InputError(
            f"output folder {out_dir} exists and is not a report (no {REPORT_FILE} in it); "
            "--overwrite replaces only an earlier report, pass another --out"
        )
    with atomic_dir(out_dir, overwrite=overwrite) as staging:
        runs = [load_run(run_dir) for run_dir in run_dirs]
        unique_run_names(runs)
        extra_notes = []
        screenshot_lines: list[str] = []
        if tensorboard_screenshot and not any(run.scalars for run in runs):
            extra_notes.append("no TensorBoard screenshot: the runs hold no scalars to show")
        elif tensorboard_screenshot:
            try:
                screenshot_tensorboard(
                    {run.name: run.path for run in runs}, staging / SCREENSHOT_FILE, chromium
                )
                screenshot_lines = [
                    "## TensorBoard",
                    "",
                    *figure_lines(
                        staging / SCREENSHOT_FILE, "TensorBoard's scalars page for these runs"
                    ),
                ]
            except ScreenshotError as err:
                logger.error("TensorBoard screenshot failed: %s", err)
                extra_notes.append(f"the TensorBoard screenshot failed: {err}")
        body: list[str] = []
        sections = (
            (GPT_KIND, gpt_section),
            (MNIST_KIND, mnist_section),
            (COMPARISON_KIND, comparison_section),
        )
        for kind, section in sections:
            of_kind = [run for run in runs if run.kind == kind]
            if of_kind:
                body += section(of_kind, staging)
        unknown = [run for run in runs if run.kind == UNKNOWN_KIND]
        if unknown:
            body += unknown_section(unknown)
        listing = [f"- `{run.name}`: {display_path(run.path)} ({run.kind})" for run in runs]
        lines = [
            "# Run report",
            "",
            *listing,
            "",
            *notes_section(runs, extra_notes),
            *body,
            *screenshot_lines,
        ]
        (staging / REPORT_FILE).write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    logger.info("report written to %s", out_dir / REPORT_FILE)
    return out_dir / REPORT_FILE
