"""Read what a training run left in its folder: summary JSON, TensorBoard events, nvidia-smi,
and the classification probe's results; or a parallelism comparison's folder.

Both stages write the same kind of run folder, described in `common/run_contract.py`: a
summary JSON whose name says which stage wrote it, TensorBoard event files, and the
`nvidia-smi` snapshot when a GPU was present; a pretraining run probed by `probe/run.py` also
holds one results file per label level in its probe folder. A run may be unfinished or from an
older version: `load_run` then records what is missing in `RunRecord.notes` and returns
whatever is there.
"""

from __future__ import annotations

import io
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import image as mpimg
from tensorboard.backend.event_processing import event_accumulator, io_wrapper

from common import run_contract as contract
from common.cli import InputError

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
# (feature maps are shown as they are at the end of training); skip what the report never reads.
SIZE_GUIDANCE = {
    event_accumulator.SCALARS: 0,
    event_accumulator.IMAGES: 1,
    event_accumulator.HISTOGRAMS: 1,
    event_accumulator.COMPRESSED_HISTOGRAMS: 1,
    event_accumulator.TENSORS: 1,
    event_accumulator.AUDIO: 1,
}


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
    path = path.resolve()
    record = RunRecord(path=path, kind=UNKNOWN_KIND)
    summary_kind = read_summary(record)
    if summary_kind == COMPARISON_KIND:
        # Its strategies' run folders are inside; each is a run of its own to report.
        check_summary(record)
        check_comparison_files(record)
        return record
    read_event_files(record)
    if summary_kind is None:
        record.kind = guess_kind_from_tags(record)
        record.note(
            f"no {' or '.join(SUMMARY_FILES.values())}: the run is unfinished or was stopped; "
            "the report shows what its event files hold"
        )
    else:
        check_summary(record)
    nvidia_smi_path = path / contract.NVIDIA_SMI_FILE
    if nvidia_smi_path.is_file():
        record.nvidia_smi = nvidia_smi_path.read_text(encoding="utf-8", errors="replace")
    read_probe_results(record)
    return record


def read_summary(record: RunRecord) -> str | None:
    """Fill `record.summary` and `record.kind` from the summary JSON; None when there is none."""
    present = [kind for kind, name in SUMMARY_FILES.items() if (record.path / name).is_file()]
    if not present:
        return None
    kind = record.kind = present[0]
    if len(present) > 1:
        record.note(
            f"both {' and '.join(SUMMARY_FILES[k] for k in present)} exist; "
            f"reporting it as a {kind} run"
        )
    summary_path = record.path / SUMMARY_FILES[kind]
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        record.note(f"{summary_path.name} is not valid JSON ({err}); its numbers are left out")
        return kind
    if not isinstance(summary, dict):
        record.note(f"{summary_path.name} does not hold a JSON object; its numbers are left out")
        return kind
    record.summary = summary
    return kind


def check_summary(record: RunRecord) -> None:
    """Note an unknown summary version and the expected keys that are missing."""
    summary_name = SUMMARY_FILES[record.kind]
    if record.kind == GPT_KIND and record.summary:
        version = record.summary.get("summary_version")
        if version != contract.GPT_SUMMARY_VERSION:
            record.note(
                f"{summary_name} has summary_version {version!r}, this report reads version "
                f"{contract.GPT_SUMMARY_VERSION}; values it cannot find are shown as n/a"
            )
    missing = [key for key in REQUIRED_KEYS[record.kind] if key not in record.summary]
    if missing and record.summary:
        record.note(f"{summary_name} lacks {', '.join(missing)} (shown as n/a)")


def check_comparison_files(record: RunRecord) -> None:
    """Note a comparison of another version, or without its table or figure."""
    version = record.summary.get("comparison_version")
    if record.summary and version != contract.PARALLELISM_COMPARISON_VERSION:
        record.note(
            f"{contract.PARALLELISM_COMPARISON_FILE} has comparison_version {version!r}, this "
            f"report reads version {contract.PARALLELISM_COMPARISON_VERSION}"
        )
    for name in (contract.PARALLELISM_COMPARISON_TABLE, contract.PARALLELISM_COMPARISON_FIGURE):
        if not (record.path / name).is_file():
            record.note(f"no {name}: left out")


def read_probe_results(record: RunRecord) -> None:
    """Fill `record.probes` from the probe's results files; note the ones it cannot show."""
    for path in sorted((record.path / contract.PROBE_DIR).glob("*.json")):
        name = f"{contract.PROBE_DIR}/{path.name}"
        try:
            results = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            record.note(f"{name} is not valid JSON ({err}); left out")
            continue
        if not isinstance(results, dict):
            record.note(f"{name} does not hold a JSON object; left out")
            continue
        version = results.get("probe_version")
        if version != contract.PROBE_VERSION:
            record.note(
                f"{name} has probe_version {version!r}, this report reads version "
                f"{contract.PROBE_VERSION}; values it cannot find are shown as n/a"
            )
        missing = [key for key in contract.PROBE_REQUIRED_KEYS if key not in results]
        if missing:
            record.note(f"{name} lacks {', '.join(missing)}; left out")
            continue
        record.probes[path.stem] = results


def find_event_dirs(path: Path) -> list[Path]:
    """Folders under `path` that hold TensorBoard event files (a logger may nest them)."""
    event_files = (
        p
        for p in path.rglob("*tfevents*")
        if p.is_file() and io_wrapper.IsSummaryEventsFile(str(p))
    )
    return sorted({p.parent for p in event_files})


def read_event_files(record: RunRecord) -> None:
    """Fill `record.scalars` and `record.images` with tensorboard's own event reader."""
    event_dirs = find_event_dirs(record.path)
    if not event_dirs:
        record.note("no TensorBoard event files in the folder: no curves to plot")
        return
    scalar_parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for event_dir in event_dirs:
        accumulator = event_accumulator.EventAccumulator(str(event_dir), SIZE_GUIDANCE)
        try:
            accumulator.Reload()
        # The reader raises assorted errors on damaged files; the report shows what it read.
        except Exception as err:
            record.note(f"event files in {event_dir} are damaged ({err}); using what was read")
        tags = accumulator.Tags()
        for tag in tags[event_accumulator.SCALARS]:
            events = accumulator.Scalars(tag)
            scalar_parts.setdefault(tag, []).append(
                (
                    np.array([e.step for e in events], dtype=np.int64),
                    np.array([e.wall_time for e in events], dtype=np.float64),
                    np.array([e.value for e in events], dtype=np.float64),
                )
            )
        for tag in tags[event_accumulator.IMAGES]:
            newest = accumulator.Images(tag)[-1]
            previous = record.images.get(tag)
            if previous is None or newest.step >= previous.step:
                record.images[tag] = LoggedImage(newest.step, decode_image(newest))
    for tag, parts in scalar_parts.items():
        steps, wall_times, values = (np.concatenate(column) for column in zip(*parts, strict=True))
        order = np.argsort(steps, kind="stable")
        record.scalars[tag] = ScalarSeries(steps[order], wall_times[order], values[order])
    if not record.scalars and not record.images:
        record.note("the event files hold no scalars or images yet")


def decode_image(event: event_accumulator.ImageEvent) -> np.ndarray:
    """Pixels of a logged image (TensorBoard stores PNG bytes)."""
    return mpimg.imread(io.BytesIO(event.encoded_image_string), format="png")


def guess_kind_from_tags(record: RunRecord) -> str:
    """Which stage wrote the events, from tags only that stage logs."""
    logged = set(record.scalars) | set(record.images)
    for kind, markers in KIND_MARKER_TAGS.items():
        if logged.intersection(markers):
            return kind
    return UNKNOWN_KIND


def unique_run_names(records: list[RunRecord]) -> None:
    """Name runs by folder; runs whose folder names clash get their parent folder prefixed."""
    counts: dict[str, int] = {}
    for record in records:
        counts[record.path.name] = counts.get(record.path.name, 0) + 1
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
