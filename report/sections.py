"""The report's sections, one per kind of run folder (GPT pretraining with its probe, LeNet-5,
parallelism comparison, unrecognised) and the notes; each returns its Markdown lines. A new
stage adds its section to `SECTIONS`, built from the table and figure code."""

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import run_contract as contract
from report.figures import MNIST_FIGURES, curve_section, figure_lines, gpt_figures
from report.plots import plot_confusion_matrix, plot_images, plot_probe_curves, plot_time_budgets
from report.run_folder import (
    COMPARISON_KIND,
    GPT_KIND,
    MNIST_KIND,
    UNKNOWN_KIND,
    RunRecord,
    file_stem,
)
from report.tables import (
    MISSING,
    Row,
    format_hardware,
    format_value,
    mapping_section,
    mapping_table,
    markdown_table,
    settings_section,
    summary_table,
)

NO_PEAK_FLOPS = "no peak FLOP/s known for this device"


def format_saves(saves: Any) -> str:
    if not isinstance(saves, list) or not all(isinstance(save, dict) for save in saves):
        return format_value(saves)
    return f"{len(saves)}, {format_value(sum(save.get('seconds') or 0.0 for save in saves))}"


def format_compile(counts: Any) -> str:
    if not isinstance(counts, dict):
        return "not compiled" if counts is None else format_value(counts)
    return f"{format_value(counts.get('compiles'))}, {format_value(counts.get('recompiles'))}"


GPT_ROWS = (
    Row("wall time, launch to end (s)", "wall_seconds"),
    Row("training loop (s)", "train_loop_seconds"),
    Row("tokens trained", "tokens_trained"),
    Row("tokens asked for (--max_train_tokens)", "token_budget"),
    Row("tokens/s", "tokens_per_second"),
    Row("MFU (fraction of peak)", "mfu"),
    Row("final loss (mean of the last logged steps)", "final_loss"),
    Row("logged steps in the final loss", "final_loss_window"),
    Row("loss threshold", "loss_threshold"),
    Row("final loss predicted before the run, +- its margin", "expected_final_loss"),
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
    Row("checkpoint saves: number, seconds in all", "checkpoint_saves", format_saves),
    Row("torch.compile: compilations, recompilations", "compile", format_compile),
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


def notes_section(runs: Sequence[RunRecord], extra_notes: Sequence[str]) -> list[str]:
    items = [f"- `{run.name}`: {note}" for run in runs for note in run.notes]
    items += [f"- {note}" for note in extra_notes]
    return ["## Notes", "", *items, ""] if items else []


def text_lines(heading: str, text: str) -> list[str]:
    """A heading over `text` shown as it is."""
    return [heading, "", "```text", text.rstrip(), "```", ""]


def nvidia_smi_lines(runs: Sequence[RunRecord]) -> list[str]:
    """nvidia-smi's view of each run halfway; a run without a GPU says so where it would be."""
    lines: list[str] = []
    for run in runs:
        if run.nvidia_smi:
            lines += text_lines(f"### nvidia-smi during `{run.name}`", run.nvidia_smi)
        elif contract.GPU_UTILIZATION not in run.scalars:
            lines += [
                f"GPU of `{run.name}`: no GPU in this run (on a GPU, its utilisation, memory and "
                "power over time and nvidia-smi's view halfway through training appear here).",
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


TIME_BUDGET_FIGURE = "gpt_time_budget.png"
TIME_BUDGET_CAPTION = "Where each run's wall time went, launch to end, in seconds"
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


def time_budget_lines(runs: Sequence[RunRecord], out_dir: Path) -> list[str]:
    """Where each run's wall time went (runs whose summary has a time budget): a stacked bar
    per run and the seconds in a table."""
    timed = [run for run in runs if run.time_budget]
    if not plot_time_budgets(timed, out_dir / TIME_BUDGET_FIGURE):
        return []
    parts = [p for p in contract.GPT_TIME_BUDGET_PARTS if any(p in r.time_budget for r in timed)]
    table = mapping_table(timed, [run.time_budget for run in timed], parts)
    return [*figure_lines(out_dir / TIME_BUDGET_FIGURE, TIME_BUDGET_CAPTION), *table, ""]


def gpt_section(runs: Sequence[RunRecord], out_dir: Path) -> list[str]:
    lines = ["## GPT-2 pretraining", "", "### Results", "", *summary_table(runs, GPT_ROWS), ""]
    lines += time_budget_lines(runs, out_dir)
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
            heading = f"### Accelerator state of `{run.name}`"
            lines += text_lines(heading, str(run.summary["accelerator_state"]))
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
        tags = sorted(tag for tag in run.images if tag.startswith(contract.FEATURE_MAPS_PREFIX))
        if plot_images(run, tags, path):
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


def unknown_section(runs: Sequence[RunRecord], out_dir: Path) -> list[str]:
    lines = ["## Unrecognised folders", ""]
    for run in runs:
        tags = sorted(run.scalars) + sorted(run.images)
        found = ", ".join(f"`{tag}`" for tag in tags) if tags else "nothing"
        lines.append(f"- `{run.name}` ({display_path(run.path)}): logged {found}")
    return [*lines, ""]


# Each kind of run folder's section (its kind: report/run_folder.py), in the report's order.
SECTIONS = {
    GPT_KIND: gpt_section,
    MNIST_KIND: mnist_section,
    COMPARISON_KIND: comparison_section,
    UNKNOWN_KIND: unknown_section,
}


def display_path(path: Path) -> str:
    """A run folder as the reader would type it: relative to the working folder when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
