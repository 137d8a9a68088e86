"""Build the report: figures and report.md from one or more run folders, of any mix of kinds
(each kind's section: report/sections.py); runs of the same kind are overlaid in one set of
figures (legend = run folder)."""

import logging
from collections.abc import Sequence
from pathlib import Path

from common.cli import InputError
from common.files import atomic_dir
from report.figures import figure_lines
from report.run_folder import RunRecord, load_run, unique_run_names
from report.sections import SECTIONS, display_path, notes_section
from report.tensorboard_screenshot import ScreenshotError, find_chromium, screenshot_tensorboard

logger = logging.getLogger(__name__)

REPORT_FILE = "report.md"
SCREENSHOT_FILE = "tensorboard_scalars.png"


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
        extra_notes: list[str] = []
        body: list[str] = []
        for kind, section in SECTIONS.items():
            of_kind = [run for run in runs if run.kind == kind]
            if of_kind:
                body += section(of_kind, staging)
        if tensorboard_screenshot:
            body += screenshot_section(runs, staging, chromium, extra_notes)
        listing = [f"- `{run.name}`: {display_path(run.path)} ({run.kind})" for run in runs]
        lines = ["# Run report", "", *listing, "", *notes_section(runs, extra_notes), *body]
        (staging / REPORT_FILE).write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    logger.info("report written to %s", out_dir / REPORT_FILE)
    return out_dir / REPORT_FILE


def screenshot_section(
    runs: Sequence[RunRecord], out_dir: Path, chromium: str, notes: list[str]
) -> list[str]:
    """TensorBoard's scalars page for the runs; [] and a note when it has nothing to show or
    the screenshot failed."""
    if not any(run.scalars for run in runs):
        notes.append("no TensorBoard screenshot: the runs hold no scalars to show")
        return []
    path = out_dir / SCREENSHOT_FILE
    try:
        screenshot_tensorboard({run.name: run.path for run in runs}, path, chromium)
    except ScreenshotError as err:
        logger.error("TensorBoard screenshot failed: %s", err)
        notes.append(f"the TensorBoard screenshot failed: {err}")
        return []
    return ["## TensorBoard", "", *figure_lines(path, "TensorBoard's scalars page for these runs")]
