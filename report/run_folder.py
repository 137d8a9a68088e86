"""Read what a training run left in its folder (`common/run_contract.py`): summary JSON,
TensorBoard events, nvidia-smi, and the classification probe's results; or a parallelism
comparison's folder. A run may be unfinished or from an older version: `load_run` then records
what is missing in `RunRecord.notes` and returns whatever is there.
"""

import fcntl
import functools
import io
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import image as mpimg
from tensorboard.backend.event_processing import event_accumulator, io_wrapper

from common import run_contract as contract
from common.cli import InputError
from common.files import LOCK_FILE, sealed_folder_damage

logger = logging.getLogger(__name__)

GPT_KIND = "gpt"
MNIST_KIND = "mnist"
COMPARISON_KIND = "parallelism comparison"  # compare-parallelism's folder: a table and figure
UNKNOWN_KIND = "unknown"

SUMMARY_FILES = {
    GPT_KIND: contract.GPT_SUMMARY_FILE,
    MNIST_KIND: contract.MNIST_METRICS_FILE,
    COMPARISON_KIND: contract.PARALLELISM_COMPARISON_FILE,
}
# The key that carries each summary's version, and the version this checkout reads.
VERSIONS = {
    GPT_KIND: ("summary_version", contract.GPT_SUMMARY_VERSION),
    COMPARISON_KIND: ("comparison_version", contract.PARALLELISM_COMPARISON_VERSION),
}
REQUIRED_KEYS = {
    GPT_KIND: contract.GPT_REQUIRED_KEYS,
    MNIST_KIND: contract.MNIST_REQUIRED_KEYS,
    COMPARISON_KIND: contract.PARALLELISM_COMPARISON_REQUIRED_KEYS,
}

# Tags only one stage writes: they tell the kind of a run that has no summary yet.
KIND_MARKER_TAGS = {
    GPT_KIND: (contract.TOKENS_PER_SECOND, contract.MFU, contract.GRAD_NORM),
    MNIST_KIND: (contract.VAL_ACC, contract.TRAIN_ACC, contract.EPOCH_TRAIN_LOSS),
}

# Keep every scalar (the report plots whole curves) but only the newest image per tag
# (feature maps are shown as they are at the end of training); tensorboard's small defaults for
# what the report never reads.
SIZE_GUIDANCE = {event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 1}


@dataclass
class ScalarSeries:
    """One scalar tag over a run, ordered by step."""

    steps: np.ndarray
    wall_times: np.ndarray
    values: np.ndarray


@dataclass
class LoggedImage:
    """The newest image logged under one tag, decoded to an array (H x W [x C], floats 0..1)."""

    step: int
    pixels: np.ndarray


@dataclass
class RunRecord:
    """Everything the report needs from one run folder."""

    path: Path
    kind: str
    summary: dict[str, Any] = field(default_factory=dict)
    scalars: dict[str, ScalarSeries] = field(default_factory=dict)
    images: dict[str, LoggedImage] = field(default_factory=dict)
    nvidia_smi: str | None = None
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # label level -> results
    notes: list[str] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = self.path.name

    @property
    def start_wall_time(self) -> float | None:
        """Wall time (Unix seconds) of the earliest scalar logged, for time axes."""
        starts = [series.wall_times[0] for series in self.scalars.values() if len(series.steps)]
        return min(starts) if starts else None

    @functools.cached_property
    def time_budget(self) -> dict[str, float]:
        """Where the run's wall time went: part -> seconds, in the order of
        `GPT_TIME_BUDGET_PARTS`; {} for a summary without one."""
        budget = self.summary.get("time_budget")
        budget = budget if isinstance(budget, dict) else {}
        parts = contract.GPT_TIME_BUDGET_PARTS
        return {part: budget[part] for part in parts if isinstance(budget.get(part), int | float)}

    def note(self, message: str) -> None:
        """Record something missing or odd; it is logged now and listed in the report."""
        logger.warning("%s: %s", self.name, message)
        self.notes.append(message)


def load_run(run_dir: str | Path) -> RunRecord:
    """Read one run folder. Raises InputError only when the folder does not exist."""
    path = Path(run_dir)
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise InputError(
            f"run folder {path} {what}; pass the output folder of pretrain/run.py, "
            "mnist.train or mnist.train_lightning"
        )
    record = RunRecord(path=path.resolve(), kind=UNKNOWN_KIND)
    read_summary(record)
    if record.kind == COMPARISON_KIND:
        # Its strategies' run folders are inside; each is a run of its own to report.
        for name in (contract.PARALLELISM_COMPARISON_TABLE, contract.PARALLELISM_COMPARISON_FIGURE):
            if not (record.path / name).is_file():
                record.note(f"no {name}: left out")
        return record
    read_event_files(record)
    running = read_lock(record)
    if running:
        record.note(f"running ({running}): the report shows what it has written so far")
    if record.kind == UNKNOWN_KIND:  # no summary: the stage whose own tags the events hold
        logged = set(record.scalars) | set(record.images)
        kinds = (kind for kind, markers in KIND_MARKER_TAGS.items() if logged.intersection(markers))
        record.kind = next(kinds, UNKNOWN_KIND)
        if not running:
            record.note(
                f"no {' or '.join(SUMMARY_FILES.values())}: the run is unfinished or was "
                "stopped; the report shows what its event files hold"
            )
    final_dir = record.path / contract.FINAL_MODEL_DIR
    damage = sealed_folder_damage(final_dir) if final_dir.is_dir() else None
    if damage:
        record.note(f"{contract.FINAL_MODEL_DIR}/ is damaged: {damage}")
    nvidia_smi_path = record.path / contract.NVIDIA_SMI_FILE
    if nvidia_smi_path.is_file():
        record.nvidia_smi = nvidia_smi_path.read_text(encoding="utf-8", errors="replace")
    read_probe_results(record)
    return record


def read_summary(record: RunRecord) -> None:
    """Fill `record.summary` and `record.kind` from the summary JSON, if there is one; note the
    expected keys it lacks."""
    present = [kind for kind, name in SUMMARY_FILES.items() if (record.path / name).is_file()]
    if not present:
        return
    kind = record.kind = present[0]
    if len(present) > 1:
        record.note(
            f"both {' and '.join(SUMMARY_FILES[k] for k in present)} exist; "
            f"reporting it as a {kind} run"
        )
    path = record.path / SUMMARY_FILES[kind]
    try:
        record.summary = contract.read_json_object(
            path, *VERSIONS.get(kind, (None, None)), record.note, REQUIRED_KEYS[kind]
        )
    except InputError as err:
        record.note(f"{err}; its numbers are left out")
        return
    missing = [key for key in REQUIRED_KEYS[kind] if key not in record.summary]
    if missing:
        record.note(f"{path.name} lacks {', '.join(missing)} (shown as n/a)")


def read_probe_results(record: RunRecord) -> None:
    """Fill `record.probes` from the probe's results files; note the ones it cannot show."""
    for path in sorted((record.path / contract.PROBE_DIR).glob("*.json")):
        try:
            results = contract.read_json_object(
                path,
                "probe_version",
                contract.PROBE_VERSION,
                record.note,
                contract.PROBE_REQUIRED_KEYS,
            )
        except InputError as err:
            record.note(f"{err}; left out")
            continue
        missing = [key for key in contract.PROBE_REQUIRED_KEYS if key not in results]
        if missing:
            record.note(f"{path.name} lacks {', '.join(missing)}; left out")
            continue
        record.probes[path.stem] = results


def read_lock(record: RunRecord) -> str | None:
    """Which process holds the folder's lock ("process P on H"): a run still writing the folder;
    None when no run does. A lock file that no process holds is noted as stale."""
    try:
        handle = (record.path / LOCK_FILE).open(encoding="utf-8")
    except OSError:
        return None
    with handle:
        holder = handle.read().strip() or "a process"
        try:
            # Refused while the run holds its exclusive lock; released again by the close.
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return holder.split(" since ")[0]
    record.note(f"{LOCK_FILE} is stale: {holder} wrote it and is gone without removing it")
    return None


def find_event_dirs(path: Path) -> list[Path]:
    """Folders under `path` with event files (a logger may nest them), as TensorBoard finds runs."""
    return sorted(map(Path, io_wrapper.GetLogdirSubdirectories(str(path))))


def read_event_files(record: RunRecord) -> None:
    """Fill `record.scalars` and `record.images` with tensorboard's own event reader."""
    event_dirs = find_event_dirs(record.path)
    if not event_dirs:
        record.note("no TensorBoard event files in the folder: no curves to plot")
        return
    scalar_events: dict[str, list[event_accumulator.ScalarEvent]] = {}
    for event_dir in event_dirs:
        accumulator = event_accumulator.EventAccumulator(str(event_dir), SIZE_GUIDANCE)
        try:
            accumulator.Reload()
        # The reader raises assorted errors on damaged files; the report shows what it read.
        except Exception as err:
            record.note(f"event files in {event_dir} are damaged ({err}); using what was read")
        tags = accumulator.Tags()
        for tag in tags[event_accumulator.SCALARS]:
            scalar_events.setdefault(tag, []).extend(accumulator.Scalars(tag))
        for tag in tags[event_accumulator.IMAGES]:
            newest = accumulator.Images(tag)[-1]
            previous = record.images.get(tag)
            if previous is None or newest.step >= previous.step:
                # TensorBoard stores PNG bytes.
                pixels = mpimg.imread(io.BytesIO(newest.encoded_image_string), format="png")
                record.images[tag] = LoggedImage(newest.step, pixels)
    for tag, events in scalar_events.items():
        events.sort(key=lambda event: event.step)  # stable: a step logged twice keeps its order
        steps, wall_times, values = np.array([(e.step, e.wall_time, e.value) for e in events]).T
        record.scalars[tag] = ScalarSeries(steps.astype(np.int64), wall_times, values)
    if not record.scalars and not record.images:
        record.note("the event files hold no scalars or images yet")


def unique_run_names(records: list[RunRecord]) -> None:
    """Name runs by folder; runs whose folder names clash get their parent folder prefixed."""
    counts = Counter(record.path.name for record in records)
    seen: set[str] = set()
    for index, record in enumerate(records):
        name = record.path.name
        if counts[name] > 1:
            name = f"{record.path.parent.name}/{name}"
        if name in seen:
            name = f"{name}-{index}"
        seen.add(name)
        record.name = name


def file_stem(name: str) -> str:
    """A run name made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "run"
