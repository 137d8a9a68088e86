"""Both MNIST trainers, for real on the embedded digits (a few dozen CPU steps each): loss goes
down, metrics.json loads back, and TensorBoard holds the same scalars, images, histograms,
graph and projector embedding for both. Also: the metrics both compute, training and test sets
that lack some digits, and both trainers' logs free of library lines that tell the user nothing."""

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mnist_runs import NUM_PROJECTOR_DIGITS, SHORT_RUN
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.run_contract import (
    ACTIVATIONS_PREFIX,
    EPOCH_TRAIN_ACC,
    EPOCH_TRAIN_LOSS,
    FEATURE_MAPS_PREFIX,
    FILTERS_PREFIX,
    LEARNING_RATE,
    MNIST_METRICS_FILE,
    MNIST_MODEL_FILE,
    TENSORBOARD_DIR,
    TEST_ACC,
    TEST_LOSS,
    TRAIN_ACC,
    TRAIN_LOSS,
    VAL_ACC,
    VAL_LOSS,
    WEIGHTS_PREFIX,
)
from mnist.data import count_shared_images
from mnist.idx import write_idx
from mnist.metrics import DigitMetrics
from mnist.model import CONV_LAYERS, LeNet5
from mnist.train import main as train_main
from mnist.train_lightning import main as train_lightning_main

REPO_ROOT = Path(__file__).resolve().parent.parent
SCALARS = {
    TRAIN_LOSS,
    TRAIN_ACC,
    LEARNING_RATE,
    EPOCH_TRAIN_LOSS,
    EPOCH_TRAIN_ACC,
    VAL_LOSS,
    VAL_ACC,
    TEST_LOSS,
    TEST_ACC,
}
IMAGES = {
    prefix + layer for prefix in (FEATURE_MAPS_PREFIX, FILTERS_PREFIX) for layer in CONV_LAYERS
}
LAYERS = ("conv1", "pool1", "conv2", "pool2", "fc1", "fc2", "fc3")
HISTOGRAMS = {ACTIVATIONS_PREFIX + layer for layer in LAYERS} | {
    WEIGHTS_PREFIX + layer for layer in LAYERS if not layer.startswith("pool")
}
TRAINERS = pytest.mark.parametrize(
    "main", [train_main, train_lightning_main], ids=["pytorch", "lightning"]
)


def read_events(run_dir: Path) -> EventAccumulator:
    events = EventAccumulator(
        str(run_dir / TENSORBOARD_DIR), size_guidance={"scalars": 0, "images": 0, "histograms": 0}
    )
    events.Reload()
    return events


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize("run", ["mnist_pytorch_run", "mnist_lightning_run"])
def test_metrics_json_loads_back_and_is_consistent(request, run):
    run_dir = request.getfixturevalue(run)
    metrics = json.loads((run_dir / MNIST_METRICS_FILE).read_text())
    assert metrics["trainer"] == run.removeprefix("mnist_").removesuffix("_run")
    assert (metrics["num_train"], metrics["num_val"], metrics["num_test"]) == (3600, 400, 1000)
    confusion = torch.tensor(metrics["confusion_matrix"])
    assert confusion.shape == (10, 10) and int(confusion.sum()) == 1000
    assert metrics["test_accuracy"] == pytest.approx(int(confusion.trace()) / 1000)
    assert metrics["test_accuracy"] > 0.5  # chance is 0.1
    assert metrics["test_loss"] < 2.0  # ln(10) = 2.3 at chance
    assert metrics["epochs"] == len(metrics["history"]) == 2
    first, last = metrics["history"]
    assert last["train_loss"] < first["train_loss"]
    assert 0 <= first["val_acc"] <= 1 and first["seconds"] > 0
    assert metrics["data_source"].startswith("sample") and metrics["device"] == "cpu"
    assert metrics["config"]["batch_size"] == 128
    assert {"hardware", "versions", "train_seconds"} <= set(metrics)
    model = LeNet5()
    model.load_state_dict(torch.load(run_dir / MNIST_MODEL_FILE))


@pytest.mark.parametrize("run", ["mnist_pytorch_run", "mnist_lightning_run"])
def test_tensorboard_holds_scalars_images_histograms_graph(request, run):
    events = read_events(request.getfixturevalue(run))
    tags = events.Tags()
    assert set(tags["scalars"]) >= SCALARS
    assert set(tags["images"]) == IMAGES
    assert set(tags["histograms"]) >= HISTOGRAMS
    assert tags["graph"]
    losses = [event.value for event in events.Scalars(TRAIN_LOSS)]
    assert len(losses) >= 10
    assert mean(losses[-3:]) < 0.7 * mean(losses[:3])  # loss goes down
    # Feature maps: one row per probe digit (0..9), the digit then each channel of the layer.
    conv1 = events.Images(FEATURE_MAPS_PREFIX + "conv1")
    assert len(conv1) == 3  # before training and after each epoch
    assert (conv1[-1].width, conv1[-1].height) == (2 + 7 * 30, 2 + 10 * 30)
    assert events.Images(FEATURE_MAPS_PREFIX + "conv2")[-1].width == 2 + 17 * 30


@pytest.mark.parametrize("run", ["mnist_pytorch_run", "mnist_lightning_run"])
def test_projector_embedding_has_features_thumbnails_and_labels(request, run):
    log_dir = request.getfixturevalue(run) / TENSORBOARD_DIR
    config = (log_dir / "projector_config.pbtxt").read_text()
    assert 'tensor_name: "penultimate_fc2' in config
    (embedding_dir,) = {path.parent for path in log_dir.glob("*/penultimate_fc2/tensors.tsv")}
    rows = (embedding_dir / "tensors.tsv").read_text().splitlines()
    assert len(rows) == NUM_PROJECTOR_DIGITS and len(rows[0].split("\t")) == 84
    labels = (embedding_dir / "metadata.tsv").read_text().split()
    assert len(labels) == NUM_PROJECTOR_DIGITS and set(labels) <= {str(d) for d in range(10)}
    assert len(set(labels)) >= 5  # a spread of classes, not the first digits of a sorted set
    assert (embedding_dir / "sprite.png").stat().st_size > 0
    assert "sprite.png" in config


def test_both_trainers_write_the_same_scalar_tags(mnist_pytorch_run, mnist_lightning_run):
    plain = set(read_events(mnist_pytorch_run).Tags()["scalars"])
    lightning = set(read_events(mnist_lightning_run).Tags()["scalars"])
    assert lightning - {"epoch"} == plain  # Lightning adds its own epoch counter


def test_existing_run_folder_needs_overwrite(mnist_pytorch_run, capsys):
    before = (mnist_pytorch_run / MNIST_METRICS_FILE).read_text()
    assert train_main([*SHORT_RUN, "--output_dir", str(mnist_pytorch_run)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert (mnist_pytorch_run / MNIST_METRICS_FILE).read_text() == before


def test_same_seed_same_weights(tmp_path):
    runs = []
    for name in ("a", "b"):
        argv = [*SHORT_RUN, "--max_steps", "5", "--output_dir", str(tmp_path / name)]
        assert train_main(argv) == 0
        runs.append(torch.load(tmp_path / name / MNIST_MODEL_FILE))
    assert all(torch.equal(runs[0][key], runs[1][key]) for key in runs[0])


@TRAINERS
def test_help_lists_the_shared_flags(main, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ("--data_dir", "--download", "--on_device_data", "--max_steps", "--config"):
        assert flag in help_text


def test_digit_metrics_weigh_every_digit_once():
    torch.manual_seed(0)
    batch_sizes = (7, 1, 12)  # unequal: a mean of batch means would differ
    logits = [torch.randn(size, 10) for size in batch_sizes]
    labels = [torch.randint(0, 10, (size,)) for size in batch_sizes]
    metrics = DigitMetrics(with_confusion_matrix=True)
    for batch_logits, batch_labels in zip(logits, labels, strict=True):
        batch_loss, batch_accuracy = metrics(batch_logits, batch_labels)
        torch.testing.assert_close(batch_loss, F.cross_entropy(batch_logits, batch_labels))
        expected = (batch_logits.argmax(dim=1) == batch_labels).float().mean()
        torch.testing.assert_close(batch_accuracy, expected)
    all_logits, all_labels = torch.cat(logits), torch.cat(labels)
    predictions = all_logits.argmax(dim=1)
    result = metrics.compute()
    assert result.loss == pytest.approx(F.cross_entropy(all_logits, all_labels).item(), rel=1e-6)
    assert result.accuracy == pytest.approx((predictions == all_labels).float().mean().item())
    expected_confusion = torch.zeros(10, 10, dtype=torch.long)
    for true, predicted in zip(all_labels, predictions, strict=True):
        expected_confusion[true, predicted] += 1
    assert torch.equal(result.confusion_matrix, expected_confusion)


# ---------------------------------------------------------------- odd splits

ODD_SPLIT_RUN = [
    "--epochs", "1",
    "--batch_size", "16",
    "--log_every_n_steps", "2",
    "--num_projector_digits", "10",
    "--val_fraction", "0.25",
    "--device", "cpu",
]  # fmt: skip


def write_digits(folder: Path, train_digits: list[int], test_digits: list[int]) -> Path:
    """Four IDX files in LeCun's names: 8 training and 3 test images of each digit given."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for prefix, digits, per_digit in (("train", train_digits, 8), ("t10k", test_digits, 3)):
        labels = np.repeat(np.array(digits, dtype=np.uint8), per_digit)
        images = rng.integers(0, 256, size=(len(labels), 28, 28), dtype=np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels)
    return folder


ALL_DIGITS = list(range(10))


@TRAINERS
@pytest.mark.parametrize(
    "test_digits",
    [ALL_DIGITS, [0, 1, 2, 4, 5, 6, 8, 9]],
    ids=["test_set_has_them", "test_set_lacks_them"],
)
def test_training_set_without_some_digits_is_one_line_and_writes_nothing(
    tmp_path, capsys, main, test_digits
):
    train_digits = [0, 1, 2, 4, 5, 6, 8, 9]  # no 3, no 7
    data_dir = write_digits(tmp_path / "mnist", train_digits, test_digits)
    output_dir = tmp_path / "runs" / "run"
    assert main([*ODD_SPLIT_RUN, "--data_dir", str(data_dir), "--output_dir", str(output_dir)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "hold no digit 3, 7" in errors[0]
    assert str(data_dir / "train-labels-idx1-ubyte") in errors[0]
    assert not (tmp_path / "runs").exists()  # not even a temporary folder


@TRAINERS
def test_test_set_without_some_digits_trains_and_shows_the_digits_it_has(tmp_path, caplog, main):
    test_digits = [0, 1, 2, 5, 6, 8, 9]  # no 3, 4 or 7
    data_dir = write_digits(tmp_path / "mnist", ALL_DIGITS, test_digits)
    output_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="mnist.viz"):
        code = main([*ODD_SPLIT_RUN, "--data_dir", str(data_dir), "--output_dir", str(output_dir)])
    assert code == 0
    assert "the test set has no digit 3, 4, 7" in caplog.text
    metrics = json.loads((output_dir / MNIST_METRICS_FILE).read_text())
    assert metrics["num_test"] == 3 * len(test_digits)
    confusion = torch.tensor(metrics["confusion_matrix"])
    assert confusion.sum(dim=1).tolist() == [3 if d in test_digits else 0 for d in ALL_DIGITS]
    # One feature-map row per digit the test set has.
    feature_maps = read_events(output_dir).Images(FEATURE_MAPS_PREFIX + "conv1")
    assert feature_maps[-1].height == 2 + len(test_digits) * 30


@TRAINERS
def test_test_digits_that_repeat_training_digits_are_counted_and_said(
    tmp_path, capsys, caplog, main
):
    """Test files that copy the training files train, but the log and metrics.json say how many
    test digits the model was trained on, and the result line puts it beside the accuracy."""
    data_dir = write_digits(tmp_path / "mnist", ALL_DIGITS, ALL_DIGITS)
    for kind in ("images-idx3", "labels-idx1"):  # the test files become the first 30 training
        train = (data_dir / f"train-{kind}-ubyte").read_bytes()
        header = 16 if kind.startswith("images") else 8
        item = 784 if kind.startswith("images") else 1
        test = bytearray(train[: header + 30 * item])
        test[4:8] = (30).to_bytes(4, "big")
        (data_dir / f"t10k-{kind}-ubyte").write_bytes(bytes(test))
    output_dir = tmp_path / "run"
    argv = [*ODD_SPLIT_RUN, "--data_dir", str(data_dir), "--output_dir", str(output_dir)]
    with caplog.at_level(logging.WARNING, logger="mnist.data"):
        assert main(argv) == 0
    assert "30 of the 30 test digits are also training digits" in caplog.text
    assert "on 30 digits (30 of them also training digits)" in capsys.readouterr().out
    metrics = json.loads((output_dir / MNIST_METRICS_FILE).read_text())
    assert metrics["num_test_in_train"] == metrics["num_test"] == 30


@TRAINERS
def test_a_run_folder_name_that_is_not_utf8_is_one_line_and_exit_2(tmp_path, capsys, main):
    output_dir = os.fsdecode(os.fsencode(tmp_path / "runs") + b"/run\xff")
    assert main([*SHORT_RUN, "--output_dir", output_dir]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "runs/run\\xff" in errors[0]
    assert not (tmp_path / "runs").exists()


def test_distinct_test_digits_are_not_counted_as_training_digits():
    images = np.arange(3 * 784, dtype=np.uint8).reshape(3, 28, 28)
    assert count_shared_images(images[:2], images[2:]) == 0
    assert count_shared_images(images, images[1:]) == 2


# ---------------------------------------------------------------- a quiet log


# Library lines that tell the user nothing: Lightning's hints for setups other than this run
# (srun, workers, limit_val_batches), its banner, its notes on where a loop stopped, a cloud
# logger's advert, a deprecation inside Lightning, the seed line, a model summary's FLOPs
# without an example input.
NOISE = [
    "Total FLOPs: 0",
    "litlogger",
    "srun",
    "LeafSpec",
    "limit_val_batches",
    "GPU available",
    "TPU available",
    "stepping batches",
    "`Trainer.fit` stopped",
    "Seed set",
]


# Both trainers' line at an epoch's end; Lightning validates only after a whole epoch.
EPOCH_LINE = re.compile(
    r"INFO mnist\.experiment: epoch 1/1: train loss \d\.\d{4}, acc \d+\.\d%"
    r"(?:, val loss \d\.\d{4}, val acc \d+\.\d%)?, \d+s elapsed, 0s left$",
    re.MULTILINE,
)


@pytest.mark.slow
@pytest.mark.parametrize("module", ["mnist.train", "mnist.train_lightning"])
def test_run_log_has_none_of_the_noise_lines(module, tmp_path):
    # Lightning's srun hint appears wherever an srun executable is on PATH outside a Slurm
    # task; one that does nothing is enough.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["OMP_NUM_THREADS"] = "1"
    argv = [*SHORT_RUN, "--max_steps", "3", "--output_dir", str(tmp_path / "run")]
    result = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    log = result.stdout + result.stderr
    assert [line for line in NOISE if line in log] == []
    # Our own log lines still show: the libraries are silenced, not logging.
    assert "INFO mnist.data: data: sample" in result.stderr
    # Without a terminal, one line per epoch (3 steps: one epoch), the same from both trainers.
    assert len(EPOCH_LINE.findall(result.stderr)) == 1, result.stderr
    assert result.stdout.strip().endswith(f"results in {tmp_path / 'run'}")
