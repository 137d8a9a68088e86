"""A PNG of TensorBoard's scalars page as users see it: TensorBoard on localhost, headless Chromium.

TensorBoard is served from this process (`tensorboard.program.TensorBoard`) on a localhost port
the OS picks, having read the event files before it answers; its scalars plugin must list tags
(so the page has data to draw); Chromium's own `--screenshot` takes the picture; the server is
shut down again whatever happens.
"""

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from tensorboard import program

from common.cli import InputError

logger = logging.getLogger(__name__)

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# The scalars dashboard filtered by a match-all regex: every chart in one expanded group
# (unfiltered, only the first two tag groups are open and `train/` comes last).
SCALARS_PAGE = "#scalars&tagFilter=.*"
WINDOW_SIZE = "1400,1600"  # width, height
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


def logdir_arguments(runs: dict[str, Path]) -> list[str]:
    """`--logdir` for one run; `--logdir_spec name:path,...` names several runs in the page."""
    if len(runs) == 1:
        return ["--logdir", str(next(iter(runs.values())))]
    spec = ",".join(
        f"{name.replace(':', '_').replace(',', '_')}:{path}" for name, path in runs.items()
    )
    return ["--logdir_spec", spec]


def screenshot_tensorboard(runs: dict[str, Path], png_path: Path, chromium: str) -> None:
    """Photograph the scalars page of TensorBoard serving `runs` (name -> folder) in `chromium`."""
    servers: list[program.WerkzeugServer] = []  # launch() returns only the URL

    def make_server(app, flags) -> program.WerkzeugServer:
        servers.append(program.WerkzeugServer(app, flags))
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
        return servers[-1]

    board = program.TensorBoard(server_class=make_server)
    # --load_fast false: the Python reader, no data-server process; --reload_task blocking with
    # --reload_interval 0: the event files are read once, before launch() returns.
    board.configure(argv=[
        None, *logdir_arguments(runs), "--host", "127.0.0.1", "--port", "0",
        "--load_fast", "false", "--reload_interval", "0", "--reload_task", "blocking",
    ])  # fmt: skip
    try:
        base_url = board.launch().rstrip("/")
    except program.TensorBoardServerException as err:
        raise ScreenshotError(f"TensorBoard did not start: {err.msg}") from None
    logger.info("TensorBoard serving on %s", base_url)
    try:
        check_scalars(base_url)
        with tempfile.TemporaryDirectory(prefix="tensorboard-screenshot-") as scratch:
            take_screenshot(chromium, f"{base_url}/{SCALARS_PAGE}", png_path, Path(scratch))
    finally:
        servers[0].shutdown()
        servers[0].server_close()
    logger.info("TensorBoard screenshot written to %s", png_path)


def check_scalars(base_url: str) -> None:
    """ScreenshotError unless TensorBoard lists at least one scalar tag."""
    # Localhost only: bypass any proxy set in the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{base_url}/data/plugin/scalars/tags", timeout=30) as response:
            tags_by_run = json.load(response)
    except (OSError, ValueError) as err:  # URLError, timeouts; JSONDecodeError
        raise ScreenshotError(f"TensorBoard did not answer with its scalar tags: {err}") from None
    if not any(tags_by_run.values()):
        raise ScreenshotError(f"TensorBoard lists no scalars for the runs: {tags_by_run}")


def take_screenshot(chromium_path: str, url: str, png_path: Path, scratch_dir: Path) -> None:
    """Load `url` in headless Chromium with a fresh profile and save the window as a PNG."""
    png_path = png_path.resolve()
    png_path.unlink(missing_ok=True)
    command = [
        chromium_path, *CHROMIUM_FLAGS, f"--user-data-dir={scratch_dir / 'chromium-profile'}",
        f"--window-size={WINDOW_SIZE}", f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}",
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
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(browser.pid, signal.SIGKILL)  # and the helpers that may outlive it
        browser.wait()
    if browser.returncode != 0 or not png_path.is_file() or png_path.stat().st_size == 0:
        tail = output.decode(errors="replace")[-2000:]
        raise ScreenshotError(f"Chromium wrote no screenshot (exit {browser.returncode}): {tail}")
