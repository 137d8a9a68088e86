"""The run-folder contract: what the training stages write and the report reads.

A run folder holds a summary JSON whose name says which stage wrote it, TensorBoard event
files, and stage-specific artifacts. Writers (`pretrain/`, `mnist/`, `probe/`) and the reader
(`report/`) import every name from here, so a file name, a summary key or a TensorBoard tag
is spelled once. Adding a field to a summary touches its writer and, if shown, the report;
`*_REQUIRED_KEYS` lists only the keys the report cannot do without. Every reader of a summary
reads it with `read_json_object` (`read_gpt_summary` for run_summary.json): strict JSON, its
version checked.
"""

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from common.cli import InputError

logger = logging.getLogger(__name__)

# File and folder names inside a run folder.
GPT_SUMMARY_FILE = "run_summary.json"  # written last by both GPT loops: the run finished
MNIST_METRICS_FILE = "metrics.json"  # written last by both LeNet-5 trainers
FINAL_MODEL_DIR = "final"  # model + tokenizer, loadable with AutoModelForCausalLM
# Written last into every checkpoint-<step>/ (pretrain/checkpoints.py): each file's size and
# checksum and the run's identity. A checkpoint without it, or whose files no longer match it,
# is incomplete.
CHECKPOINT_MANIFEST_FILE = "checkpoint_manifest.json"
# How a process's error line starts when a peer process's end ended it: the launcher shows it
# only when no process said why.
PEER_STOPPED = "another process of this run stopped"
MNIST_MODEL_FILE = "model.pt"
NVIDIA_SMI_FILE = "nvidia-smi.txt"  # `nvidia-smi` output halfway through training, with a GPU only
TENSORBOARD_DIR = "tensorboard"
# Which documents the blocks' training and validation splits hold, by keyed hash of the text
# (pretrain/blocks/packing.py writes it into the cache folder; a run copies it into its folder).
DOCUMENT_SPLIT_FILE = "document_split.json"

# run_summary.json carries its version; readers note an older one and refuse a newer one.
# 3: one `verdict` (no `loss_below_threshold`, `diverged`); `time_budget`, `checkpoint_saves`,
# `compile` and `token_budget` added.
GPT_SUMMARY_VERSION = 3
# The parts of a run's wall time in run_summary.json's `time_budget`, in the order they happen:
# launch to our code imported, tokenizer and blocks, model, the loop's set-up (Trainer), the
# first step (compilation and warm-up), the loop's other steps (checkpoint saves excluded), the
# checkpoint saves, the final save, the final evaluation, the summary, the rest. Seconds each,
# together `wall_seconds`; a part may be absent or null. pretrain/shell.py times them.
GPT_TIME_BUDGET_PARTS = (
    TIME_IMPORTS, TIME_DATA, TIME_MODEL, TIME_LOOP_SETUP, TIME_FIRST_STEP, TIME_STEPS,
    TIME_CHECKPOINT_SAVES, TIME_FINAL_SAVE, TIME_FINAL_EVAL, TIME_SUMMARY, TIME_OTHER,
) = (
    "imports", "data", "model", "trainer_setup", "first_step", "steps", "checkpoint_saves",
    "final_save", "final_eval", "summary", "other",
)  # fmt: skip

# Each required key with the JSON type of its value (null is always allowed: not known).
NUMBER = (int, float)
GPT_REQUIRED_KEYS = {
    "summary_version": int, "wall_seconds": NUMBER, "train_loop_seconds": NUMBER,
    "tokens_trained": int, "tokens_per_second": NUMBER, "mfu": NUMBER, "final_loss": NUMBER,
    "final_loss_window": int, "loss_threshold": NUMBER, "verdict": str, "eval_loss": NUMBER,
    "perplexity": NUMBER, "bits_per_byte": NUMBER, "max_steps": int,
    "global_batch_tokens": int, "num_parameters": int, "hardware": dict, "versions": dict,
    "accelerator_state": str, "config": dict, "speed_settings": dict,
}  # fmt: skip
MNIST_REQUIRED_KEYS = {
    "trainer": str, "test_accuracy": NUMBER, "test_loss": NUMBER, "confusion_matrix": list,
    "epochs": int, "train_seconds": NUMBER, "num_train": int, "num_val": int, "num_test": int,
    "data_source": str, "device": str, "history": list, "hardware": dict, "versions": dict,
    "config": dict,
}  # fmt: skip

# TensorBoard tags. Both stages: training loss and learning rate per logged step.
TRAIN_LOSS = "train/loss"
LEARNING_RATE = "train/learning_rate"
# GPT pretraining (Trainer writes the train/ and eval/ tags; ours add perf/ and gpu/).
GRAD_NORM = "train/grad_norm"
EVAL_LOSS = "eval/loss"
TOKENS_PER_SECOND = "perf/tokens_per_second"
MFU = "perf/mfu"
GPU_UTILIZATION = "gpu/utilization_percent"
GPU_MEMORY_USED = "gpu/memory_used_gib"
GPU_POWER = "gpu/power_watts"
# LeNet-5: per step, per epoch, once at the end, and the layer views.
TRAIN_ACC = "train/acc"
EPOCH_TRAIN_LOSS = "epoch/train_loss"
EPOCH_TRAIN_ACC = "epoch/train_acc"
VAL_LOSS = "val/loss"
VAL_ACC = "val/acc"
TEST_LOSS = "test/loss"
TEST_ACC = "test/acc"
FEATURE_MAPS_PREFIX = "feature_maps/"
FILTERS_PREFIX = "filters/"
WEIGHTS_PREFIX = "weights/"
ACTIVATIONS_PREFIX = "activations/"

# The classification probe (probe/run.py) writes one JSON per label level into the run folder
# of the pretraining run it probes: <run>/probe/<label_level>.json.
PROBE_DIR = "probe"
PROBE_VERSION = 2
# The classifiers, in the order they are shown: the run's weights fine-tuned, the network the
# run started from (random weights) fine-tuned with the same budget, the linear probes of both
# (frozen features), TF-IDF + logistic regression.
PROBE_PRETRAINED = "pretrained"
PROBE_RANDOM_INIT = "random_init"
PROBE_PRETRAINED_LINEAR = "pretrained_linear"
PROBE_RANDOM_INIT_LINEAR = "random_init_linear"
PROBE_TFIDF = "tfidf"
PROBE_METHODS = (
    PROBE_PRETRAINED, PROBE_RANDOM_INIT, PROBE_PRETRAINED_LINEAR, PROBE_RANDOM_INIT_LINEAR,
    PROBE_TFIDF,
)  # fmt: skip
PROBE_REQUIRED_KEYS = {
    "probe_version": int, "label_level": str, "class_names": list, "num_train": int,
    "num_test": int, "chance": dict, "pretraining_overlap": dict, "methods": dict,
}  # fmt: skip
PROBE_METHOD_REQUIRED_KEYS = ("accuracy", "macro_f1", "confusion_matrix", "train_seconds")
# The probe curve (the "curve" entry): the linear probe's accuracy after each number of
# pretraining tokens, at step 0, at every checkpoint the run folder held, and at the end.
PROBE_CURVE_POINT_KEYS = ("step", "tokens", "model", "accuracy", "macro_f1")

# bench/compare_parallelism.py writes these into its --output_dir, beside one run folder per
# strategy: the comparison (JSON, written last), its table (Markdown) and its figure.
PARALLELISM_COMPARISON_FILE = "parallelism_comparison.json"
PARALLELISM_COMPARISON_TABLE = "parallelism_comparison.md"
PARALLELISM_COMPARISON_FIGURE = "parallelism_comparison.png"
PARALLELISM_COMPARISON_VERSION = 1
PARALLELISM_COMPARISON_REQUIRED_KEYS = {
    "comparison_version": int, "command": str, "rows": list, "versions": dict,
}  # fmt: skip


def read_json_object(
    path: str | Path,
    version_key: str | None = None,
    version: int | None = None,
    note: Callable[[str], None] = logger.warning,
    key_types: Mapping[str, type | tuple[type, ...]] | None = None,
) -> dict[str, Any]:
    """The JSON object in `path`, read strictly; any fault is one InputError naming the file. A
    bare NaN or Infinity is refused: Python's json reads and writes them, but they are not JSON,
    and a NaN loss would read as a number. With `version_key`, a file of a newer `version` is
    refused (this checkout cannot know what its keys mean); one of an older version is read, and
    `note` says so. A key of `key_types` whose value is of another type (not null) is damage."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=_not_json)
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror}") from None
    except ValueError as err:  # a JSONDecodeError, a UnicodeDecodeError, or _not_json's
        raise InputError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} does not hold a JSON object")
    for key, expected in (key_types or {}).items():
        if data.get(key) is not None and not isinstance(data[key], expected):
            kind = type(data[key]).__name__
            raise InputError(f"{path} is damaged: its {key!r} is a {kind}, of another type")
    found = data.get(version_key) if version_key else version
    if isinstance(found, int) and found > version:
        raise InputError(
            f"{path} has {version_key} {found}, newer than the {version} this checkout reads; "
            "update the toolkit to read it"
        )
    if found != version:
        note(f"{Path(path).name} has {version_key} {found!r}, this checkout reads {version}")
    return data


def _not_json(constant: str) -> None:
    raise ValueError(f"it holds a bare {constant}, which JSON does not allow; null stands for it")


def read_gpt_summary(
    run_dir_or_file: str | Path, note: Callable[[str], None] = logger.warning
) -> dict[str, Any]:
    """A run folder's (or the given file's) pretraining summary, checked as `read_json_object`."""
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = path / GPT_SUMMARY_FILE
    if not path.exists():
        raise InputError(f"{path} does not exist: the run has not finished (it writes it last)")
    summary = read_json_object(
        path, "summary_version", GPT_SUMMARY_VERSION, note, GPT_REQUIRED_KEYS
    )
    missing = [key for key in GPT_REQUIRED_KEYS if key not in summary]
    if summary.get("summary_version") == GPT_SUMMARY_VERSION and missing:
        raise InputError(f"{path} is damaged: it lacks {', '.join(missing)}")
    return summary


def elapsed_and_left(elapsed: float, done: int, total: int) -> str:
    """'2m10s elapsed, 14m40s left' after `done` of `total` steps (or epochs), the time left at
    the pace so far: the end of every progress line."""
    left = elapsed / done * (total - done) if done else None
    return f"{duration(elapsed)} elapsed, {'?' if left is None else duration(left)} left"


def duration(seconds: float) -> str:
    """12s, 2m10s, 1h02m."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (
        f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
    )
