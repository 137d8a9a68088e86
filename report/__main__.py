"""Command line of the run report: `run-report RUN_DIR [RUN_DIR ...] --out DIR`."""

import logging
from dataclasses import dataclass

from transformers.hf_argparser import HfArg

from common.cli import CommandLineParser, entry_point
from report.build import SCREENSHOT_FILE, write_report


@dataclass
class RunReportArguments:
    out: str = HfArg(default="runs/report", help="Folder to write report.md and figures to.")
    overwrite: bool = HfArg(default=False, help="Replace --out if it holds an earlier report.")
    tensorboard_screenshot: bool = HfArg(
        default=False,
        help="Also start TensorBoard on localhost for the runs and save a PNG of its "
        "scalars page taken with headless Chromium.",
    )
    chromium: str | None = HfArg(
        default=None, help="Chromium executable for the screenshot (default: found on PATH)."
    )


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Write the report; exit code 1 when the requested TensorBoard screenshot failed."""
    # tensorboard's reader logs every event file it opens at INFO.
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    parser = CommandLineParser(
        [RunReportArguments],
        prog="run-report",
        usage="%(prog)s RUN_DIR [RUN_DIR ...] [--out DIR] [options]",
        description="Figures and a Markdown report (report.md) from one or more run folders.",
    )
    parser.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="Run folders; several are overlaid."
    )
    args, extra = parser.parse_dataclasses(argv)
    report = write_report(
        extra.run_dirs, args.out, args.overwrite, args.tensorboard_screenshot, args.chromium
    )
    print(report)
    screenshot_missing = not (report.parent / SCREENSHOT_FILE).is_file()
    return 1 if args.tensorboard_screenshot and screenshot_missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
