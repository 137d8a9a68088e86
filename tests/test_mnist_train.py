"""Both MNIST trainers, for real on the embedded digits (a few dozen CPU steps each): loss goes
down, metrics.json loads back, and TensorBoard holds the same scalars, images, histograms,
graph and projector embedding for both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mnist_runs import NUM_PROJECTOR_DIGITS, SHORT_RUN
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mnist.experiment import METRICS_FILE, MODEL_FILE, TENSORBOARD_DIR
from mnist.model import LeNet5
from mnist.train import main as train_main
from mnist.train_lightning import main as train_lightning_main

SCALARS = {
    "train/loss",
    "train/acc",
    "train/learning_rate",
    "epoch/train_loss",
    "epoch/train_acc",
    "val/loss",
    "val/acc",
    "test/loss",
    "test/acc",
}
IMAGES = {"feature_maps/conv1", "feature_maps/conv2", "filters/conv1", "filters/conv2"}
LAYERS = ("conv1", "pool1", "conv2", "pool2", "fc1", "fc2", "fc3")
HISTOGRAMS = {f"activations/{layer}" for layer in LAYERS} | {
    f"weights/{layer}" for layer in LAYERS if not layer.startswith("pool")
}


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
    metrics = json.loads((run_dir / METRICS_FILE).read_text())
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
    model.load_state_dict(torch.load(run_dir / MODEL_FILE))


@pytest.mark.parametrize("run", ["mnist_pytorch_run", "mnist_lightning_run"])
def test_tensorboard_holds_scalars_images_histograms_graph(request, run):
    events = read_events(request.getfixturevalue(run))
    tags = events.Tags()
    assert set(tags["scalars"]) >= SCALARS
    assert set(tags["images"]) == IMAGES
    assert set(tags["histograms"]) >= HISTOGRAMS
    assert tags["graph"]
    losses = [event.value for event in events.Scalars("train/loss")]
    assert len(losses) >= 10
    assert mean(losses[-3:]) < 0.7 * mean(losses[:3])  # loss goes down
    # Feature maps: one row per probe digit (0..9), the digit then each channel of the layer.
    conv1 = events.Images("feature_maps/conv1")
    assert len(conv1) == 3  # before training and after each epoch
    assert (conv1[-1].width, conv1[-1].height) == (2 + 7 * 30, 2 + 10 * 30)
    assert events.Images("feature_maps/conv2")[-1].width == 2 + 17 * 30


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
    before = (mnist_pytorch_run / METRICS_FILE).read_text()
    assert train_main([*SHORT_RUN, "--output_dir", str(mnist_pytorch_run)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert (mnist_pytorch_run / METRICS_FILE).read_text() == before


def test_same_seed_same_weights(tmp_path):
    runs = []
    for name in ("a", "b"):
        argv = [*SHORT_RUN, "--max_steps", "5", "--output_dir", str(tmp_path / name)]
        assert train_main(argv) == 0
        runs.append(torch.load(tmp_path / name / MODEL_FILE))
    assert all(torch.equal(runs[0][key], runs[1][key]) for key in runs[0])


@pytest.mark.parametrize("main", [train_main, train_lightning_main], ids=["pytorch", "lightning"])
def test_help_lists_the_shared_flags(main, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ("--data_dir", "--download", "--on_device_data", "--max_steps", "--config"):
        assert flag in help_text
