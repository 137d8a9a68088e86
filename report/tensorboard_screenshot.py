"""A PNG of TensorBoard's scalars page as users see it: TensorBoard on localhost, headless Chromium.

TensorBoard is started from this Python environment on a free localhost port, polled until
its scalars plugin lists tags (so the page has data to draw), photographed by Chromium's own
`--screenshot`, and stopped again whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from common.cli import InputError

logger = logging.getLogger(__name__)

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# The scalars dashboard filtered by a match-all regex: every chart in one expanded group
# (unfiltered, only the first two tag groups are open and `train/` comes last).
SCALARS_PAGE = "#scalars&tagFilter=.*"
WINDOW_SIZE = (1400, 1600)
# Seconds TensorBoard may take to read the event files and answer with tags.
TENSORBOARD_READY_TIMEOUT = 120.0
CHROMIUM_TIMEOUT = 120.0
# Page time Chromium grants the page's scripts (fetching runs, tags, data, drawing the charts)
# before it takes the picture; virtual time runs faster than the clock when the page is idle.
VIRTUAL_TIME_BUDGET_MS = 15000
# Headless, no sandbox (containers have no user namespaces), and nothing that phones home.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--no-default-browser-check", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-extensions", "--no-proxy-server",
    "--hide-scrollbars",
)  # fmt: skip


class ScreenshotError(RuntimeError):
    """TensorBoard or Chromium failed; the message carries the tail of their output."""


def find_chromium(explicit: str | None = None) -> str:
    """Path of the Chromium executable; InputError with the install command when missing."""
    found = next(filter(None, map(shutil.which, [explicit] if explicit else CHROMIUM_NAMES)), None)
    if found:
        return found
    if explicit:
        raise InputError(f"Chromium executable {explicit} not found; pass an existing path")
    raise InputError(
        "--tensorboard-screenshot needs Chromium, which is not installed; install it "
        "(Debian/Ubuntu: apt-get install chromium) or pass --chromium PATH"
    )


def free_port() -> int:
    """A localhost TCP port nobody listens on right now (accelerate has this helper, but the
    report imports neither torch nor what needs it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def logdir_arguments(runs: dict[str, Path]) -> list[str]:
    """`--logdir` for one run; `--logdir_spec name:path,...` names several runs in the page."""
    if len(runs) == 1:
        return ["--logdir", str(next(iter(runs.values())))]
    spec = ",".join(
        f"{name.replace(':', '_').replace(',', '_')}:{path}" for name, path in runs.items()
    )
    return ["--logdir_spec", spec]


def screenshot_tensorboard(runs: dict[str, Path], png_path: Path, chromium: str) -> None:
    """Photograph the scalars page of TensorBoard serving `runs` (name -> run folder) with the
    `chromium` executable (`find_chromium`)."""
    with tempfile.TemporaryDirectory(prefix="tensorboard-screenshot-") as scratch:
        scratch_dir = Path(scratch)
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        tensorboard_log = scratch_dir / "tensorboard.log"
        # --load_fast false: the Python reader, no separate data-server process to stop.
        command = [
            sys.executable, "-m", "tensorboard.main", *logdir_arguments(runs),
            "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false",
        ]  # fmt: skip
        logger.info("starting TensorBoard on %s", base_url)
        with open(tensorboard_log, "wb") as log_handle:
            tensorboard = subprocess.Popen(
                command, stdout=log_handle, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_for_scalars(base_url, tensorboard, tensorboard_log)
            take_screenshot(chromium, f"{base_url}/{SCALARS_PAGE}", png_path, scratch_dir)
        finally:
            stop_process_group(tensorboard)
    logger.info("TensorBoard screenshot written to %s", png_path)


def wait_for_scalars(base_url: str, tensorboard: subprocess.Popen, log_path: Path) -> None:
    """Return once TensorBoard lists at least one scalar tag; ScreenshotError if it never does."""
    # Localhost only: bypass any proxy set in the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + TENSORBOARD_READY_TIMEOUT
    while time.monotonic() < deadline:
        if tensorboard.poll() is not None:
            raise ScreenshotError(
                f"TensorBoard exited with code {tensorboard.returncode}: {output_tail(log_path)}"
            )
        try:
            with opener.open(f"{base_url}/data/plugin/scalars/tags", timeout=5) as response:
                tags_by_run = json.load(response)
            if any(tags_by_run.values()):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass  # not listening or not loaded yet
        time.sleep(0.5)
    raise ScreenshotError(
        f"TensorBoard listed no scalars within {TENSORBOARD_READY_TIMEOUT:.0f} s: "
        f"{output_tail(log_path)}"
    )


def take_screenshot(chromium_path: str, url: str, png_path: Path, scratch_dir: Path) -> None:
    """Load `url` in headless Chromium with a fresh profile and save the window as a PNG."""
    png_path = png_path.resolve()
    png_path.unlink(missing_ok=True)
    profile_dir = scratch_dir / "chromium-profile"
    width, height = WINDOW_SIZE
    command = [
        chromium_path, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}",
        f"--window-size={width},{height}", f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}",
        f"--screenshot={png_path}", url,
    ]  # fmt: skip
    # Chromium forks helpers: its own session lets a timeout end all of them.
    browser = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=scratch_dir,
    )
    try:
        output, _ = browser.communicate(timeout=CHROMIUM_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ScreenshotError(f"Chromium took longer than {CHROMIUM_TIMEOUT:.0f} s") from None
    finally:
        stop_process_group(browser)
    if browser.returncode != 0 or not png_path.is_file() or png_path.stat().st_size == 0:
        tail = output.decode(errors="replace")[-2000:]
        raise ScreenshotError(f"Chromium wrote no screenshot (exit {browser.returncode}): {tail}")


def stop_process_group(process: subprocess.Popen) -> None:
    """End a process started with its own session, and everything it started: helpers it
    forked may outlive it. Neither TensorBoard nor Chromium has anything to save."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def output_tail(log_path: Path, num_chars: int = 2000) -> str:
    """The end of a child's captured output, for an error message."""
    return log_path.read_text(encoding="utf-8", errors="replace")[-num_chars:].strip()
