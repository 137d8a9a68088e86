"""Figures of curves from the runs' TensorBoard scalars: which tags each figure draws, and the
Markdown that shows a figure with its caption."""

from collections.abc import Sequence
from pathlib import Path

from common import run_contract as contract
from report.plots import Curve, Panel, plot_panels
from report.run_folder import RunRecord

DEFAULT_LOSS_THRESHOLD = 7.0

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
    thresholds = (run.summary.get("loss_threshold") for run in runs)
    threshold = next((t for t in thresholds if isinstance(t, int | float)), DEFAULT_LOSS_THRESHOLD)
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
        "validation sets",
        (
            Panel(f"{metric} per step", metric, (Curve(step_tag, smoothed=True),)),
            Panel(
                f"{metric} per epoch",
                metric,
                (
                    Curve(epoch_tag, "train", marker="o"),
                    Curve(val_tag, "validation", style="--", marker="s"),
                ),
                epochs=True,
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
