"""Figures of the run report, drawn with matplotlib's object API (no pyplot, no display).

Curve figures take several runs and overlay them, one colour per run in every figure; the
per-run figures (confusion matrices, feature maps) take one. Each function returns False and
writes nothing when the runs hold none of the data it draws; a panel no run has data for is
left out of its figure rather than drawn empty.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from common import run_contract as contract
from report.run_folder import RunRecord

# Smoothing averages over about 1/20 of the curve, so short and long runs both read clearly;
# its weight never below TensorBoard's default 0.6 nor above 0.99.
SMOOTHING_SPAN_FRACTION = 1 / 20
SMOOTHING_WEIGHT_RANGE = (0.6, 0.99)
PANEL_SIZE = (6.0, 3.6)
DPI = 110
SPARSE_POINTS = 3
# Confusion matrices with more classes show colours only: the counts would not fit the cells.
MAX_ANNOTATED_CLASSES = 20


@dataclass(frozen=True)
class Curve:
    """A scalar tag drawn in one panel, in a given line style."""

    tag: str
    label: str = ""
    style: str = "-"
    smoothed: bool = False
    # Marker of every point; sparse curves (<= SPARSE_POINTS) get dots anyway, as a line alone
    # hides single points.
    marker: str | None = None


@dataclass(frozen=True)
class Panel:
    """One subplot: curves sharing axes."""

    title: str
    ylabel: str
    curves: tuple[Curve, ...]
    # x = seconds since the run's first logged scalar instead of the step (samplers log by time).
    time_axis: bool = False
    epochs: bool = False  # x = the epoch (one point each, in order) instead of the step
    hline: float | None = None
    hline_label: str = ""


def run_color(index: int) -> tuple[float, float, float, float]:
    """The colour of the index-th run, the same in every figure."""
    return colormaps["tab10"](index % 10)


def ema(values: np.ndarray) -> np.ndarray:
    """Debiased exponential moving average, as TensorBoard's smoothing slider computes it, with
    a weight averaging over ~SMOOTHING_SPAN_FRACTION of the points (window 1/(1-w))."""
    span = max(1.0, len(values) * SMOOTHING_SPAN_FRACTION)
    weight = float(np.clip(1 - 1 / span, *SMOOTHING_WEIGHT_RANGE))
    # last = weight * last + (1 - weight) * value from last = 0, divided by 1 - weight^(i+1).
    debias = 1 - weight ** np.arange(1, len(values) + 1)
    from scipy.signal import lfilter  # here: scipy.signal takes a second to import

    return lfilter([1 - weight], [1, -weight], np.asarray(values, np.float64)) / debias


def plot_panels(runs: Sequence[RunRecord], panels: Sequence[Panel], path: Path) -> bool:
    """Draw the panels that have data side by side for all runs; False (no file) when none has."""
    panels = [p for p in panels if any(c.tag in run.scalars for run in runs for c in p.curves)]
    if not panels:
        return False
    figure = Figure(figsize=(PANEL_SIZE[0] * len(panels), PANEL_SIZE[1]), layout="constrained")
    # Panels of one figure share their x axis when it is the same (steps, seconds or epochs),
    # so events line up.
    same_x = len({(panel.time_axis, panel.epochs) for panel in panels}) == 1
    axes = figure.subplots(1, len(panels), squeeze=False, sharex=same_x)[0]
    for ax, panel in zip(axes, panels, strict=True):
        draw_panel(ax, runs, panel)
    figure.savefig(path, dpi=DPI)
    return True


def draw_panel(ax, runs: Sequence[RunRecord], panel: Panel) -> None:
    """One subplot: every curve of the panel for every run that logged it."""
    for index, run in enumerate(runs):
        for curve in panel.curves:
            series = run.scalars.get(curve.tag)
            if series is None or not len(series.steps):
                continue
            x, values = series.steps, series.values
            if panel.time_axis:
                order = np.argsort(series.wall_times, kind="stable")
                x, values = series.wall_times[order] - run.start_wall_time, values[order]
            elif panel.epochs:
                x = np.arange(1, len(values) + 1)
            label = f"{run.name if len(runs) > 1 else ''} {curve.label}".strip()
            marker = curve.marker or ("o" if len(values) <= SPARSE_POINTS else None)
            draw_line(ax, x, values, run_color(index), label, curve.style, marker, curve.smoothed)
    if panel.hline is not None:
        ax.axhline(panel.hline, color="black", linestyle=":", label=panel.hline_label)
    if not panel.time_axis:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    xlabel = "epoch" if panel.epochs else "seconds since start" if panel.time_axis else "step"
    label_axes(ax, panel.title, xlabel, panel.ylabel)


def draw_line(ax, x, values, color, label="", style="-", marker=None, smoothed=False) -> None:
    """One curve; smoothed, the values are drawn faint behind their moving average."""
    if smoothed:
        ax.plot(x, values, style, color=color, alpha=0.25, linewidth=0.8)
        values = ema(values)
    ax.plot(x, values, style, color=color, label=label, marker=marker)


def label_axes(ax, title: str, xlabel: str, ylabel: str) -> None:
    """Title, axis labels, a light grid, and the legend when a curve has a label."""
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize="small")


def number_at(mapping: object, *keys: str) -> float | None:
    """`mapping[key][...]` when every level is present and the end is a number, else None:
    older results files may lack a key or hold null."""
    for key in keys:
        mapping = mapping.get(key) if isinstance(mapping, dict) else None
    return mapping if isinstance(mapping, int | float) else None


def probe_curves(run: RunRecord) -> dict[str, list[tuple[float, float]]]:
    """Label level -> the (tokens, accuracy) points of the probe curve in the run's probe
    results (those that have one), skipping points without both numbers."""
    curves = {}
    for level, results in run.probes.items():
        curve = results.get("curve")
        points = curve.get("points") if isinstance(curve, dict) else None
        usable = [
            (tokens, accuracy)
            for point in (points if isinstance(points, list) else [])
            if (tokens := number_at(point, "tokens")) is not None
            and (accuracy := number_at(point, "accuracy")) is not None
        ]
        if usable:
            curves[level] = usable
    return curves


def plot_probe_curves(runs: Sequence[RunRecord], path: Path) -> bool:
    """The training loss (left) and the linear probe's test accuracy (right) against the same
    axis, tokens of pretraining, one colour per run, one marker per label level, the chance
    level dotted; False (no file) when no run has a probe curve."""
    if not any(probe_curves(run) for run in runs):
        return False
    figure = Figure(figsize=(PANEL_SIZE[0] * 2, PANEL_SIZE[1]), layout="constrained")
    loss_ax, probe_ax = figure.subplots(1, 2, sharex=True)
    for index, run in enumerate(runs):
        color = run_color(index)
        prefix = f"{run.name} " if len(runs) > 1 else ""
        tokens_per_step = run.summary.get("global_batch_tokens")
        loss = run.scalars.get(contract.TRAIN_LOSS)
        if isinstance(tokens_per_step, int) and loss is not None and len(loss.steps):
            tokens, label = loss.steps * tokens_per_step, f"{prefix}training loss".strip()
            draw_line(loss_ax, tokens, loss.values, color, label, smoothed=True)
        unigram = number_at(run.summary, "data", "unigram_entropy_nats")
        if unigram is not None:
            loss_ax.axhline(
                unigram, color=color, linestyle=":", label=f"{prefix}unigram entropy".strip()
            )
        for marker, (level, points) in zip("osD^v", probe_curves(run).items(), strict=False):
            tokens, accuracy = zip(*points, strict=True)
            draw_line(probe_ax, tokens, accuracy, color, f"{prefix}{level}", marker=marker)
            chance = number_at(run.probes[level], "chance", "majority_class_accuracy")
            if chance is not None:
                probe_ax.axhline(
                    chance, color=color, linestyle=":", label=f"{prefix}{level}: chance"
                )
    tokens_label = "pretraining tokens"
    label_axes(loss_ax, "pretraining loss", tokens_label, "cross-entropy (nats/token)")
    label_axes(probe_ax, "linear probe of the frozen network", tokens_label, "test accuracy")
    figure.savefig(path, dpi=DPI)
    return True


def plot_time_budgets(runs: Sequence[RunRecord], path: Path) -> bool:
    """One stacked horizontal bar per run (each with a time budget), its parts in order, each
    labelled with its seconds where it is wide enough; False (no file) without runs."""
    if not runs:
        return False
    figure = Figure(figsize=(PANEL_SIZE[0] * 2, 1.5 + 0.5 * len(runs)), layout="constrained")
    ax = figure.subplots()
    names, left = [run.name for run in runs], np.zeros(len(runs))
    # A label fits a segment of about 1/25 of the longest bar.
    min_labelled = max(sum(run.time_budget.values()) for run in runs) / 25
    for index, part in enumerate(contract.GPT_TIME_BUDGET_PARTS):
        seconds = np.array([run.time_budget.get(part, 0.0) for run in runs])
        if not seconds.any():
            continue
        bars = ax.barh(names, seconds, left=left, label=part, color=colormaps["tab20"](index))
        labels = [f"{value:.3g}" if value >= min_labelled else "" for value in seconds]
        ax.bar_label(bars, labels=labels, label_type="center", fontsize="small")
        left += seconds
    ax.invert_yaxis()  # the first run on top
    ax.set_xlabel("seconds since launch")
    figure.legend(loc="outside lower center", ncols=6, fontsize="small")
    figure.savefig(path, dpi=DPI)
    return True


def plot_confusion_matrix(
    matrix: Sequence[Sequence[int]],
    title: str,
    path: Path,
    class_names: Sequence[str] | None = None,
    noun: str = "digit",
) -> bool:
    """Counts of (true, predicted) class pairs (scikit-learn's display), annotated while the
    cells are large enough to read; ticks named by `class_names` (default: the class numbers).
    False for an unusable matrix."""
    try:
        counts = np.asarray(matrix, dtype=np.int64)
    except (TypeError, ValueError):  # ragged or not numbers
        return False
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1] or counts.size == 0:
        return False
    num_classes = counts.shape[0]
    # Ten digits fit the default size; more classes (134 WoS areas) get room per class.
    side = max(6.0, 0.12 * num_classes + 3.0)
    figure = Figure(figsize=(side, side * 0.9), layout="constrained")
    named = class_names is not None and len(class_names) == num_classes
    from sklearn.metrics import ConfusionMatrixDisplay  # here: sklearn takes a second to import

    display = ConfusionMatrixDisplay(counts, display_labels=class_names if named else None)
    display.plot(
        ax=figure.subplots(),
        cmap="Blues",
        include_values=num_classes <= MAX_ANNOTATED_CLASSES,
        xticks_rotation=90 if named else "horizontal",
        text_kw={"fontsize": 8},
    )
    display.ax_.set(xlabel=f"predicted {noun}", ylabel=f"true {noun}", title=title)
    figure.savefig(path, dpi=DPI)
    return True


def plot_images(run: RunRecord, tags: Sequence[str], path: Path) -> bool:
    """The newest logged image of each feature-map tag, one row per tag, each as wide as its
    image at the row's height (no wide margins beside a tall grid), as trained; False when none
    was logged."""
    present = [tag for tag in tags if tag in run.images]
    if not present:
        return False
    aspect = max(
        run.images[tag].pixels.shape[1] / run.images[tag].pixels.shape[0] for tag in present
    )
    figure = Figure(figsize=(max(6.0, 4.0 * aspect), 4.4 * len(present)), layout="constrained")
    axes = figure.subplots(len(present), 1, squeeze=False)[:, 0]
    for ax, tag in zip(axes, present, strict=True):
        image = run.images[tag]
        grey = image.pixels.ndim == 2
        ax.imshow(image.pixels, cmap="gray" if grey else None, interpolation="nearest")
        ax.set_title(f"{tag}: a test digit a row, then each channel's map")
        ax.set_axis_off()
    figure.savefig(path, dpi=DPI)
    return True
