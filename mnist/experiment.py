"""What a training run needs whichever trainer runs it: device, optimizer and schedule, the
run folder's contents (metrics.json, model.pt)."""

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.seed import seed_everything
from torch import nn

from common.cli import InputError, parse_args
from common.files import atomic_dir, write_json_atomic
from common.run_contract import MNIST_METRICS_FILE, MNIST_MODEL_FILE, elapsed_and_left
from common.system import hardware_description, library_versions
from mnist.args import MnistArguments
from mnist.data import DigitSplits, load_digit_splits
from mnist.metrics import Evaluation

logger = logging.getLogger(__name__)
# Bars redraw in place on a terminal; a log file (a Slurm job's) gets a line per epoch instead.
PROGRESS_BARS = sys.stderr.isatty()


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; anything else must be a usable torch device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"--device {name} is not a device name; use auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {name} asked for, but no CUDA GPU is visible; use --device cpu")
    return device


def default_output_dir(args: MnistArguments, trainer: str) -> Path:
    return Path(args.output_dir or f"runs/mnist_{trainer}")


def check_utf8_name(folder: Path) -> None:
    """TensorBoard's writer encodes its file names as UTF-8: a name that is not is refused here,
    not in a traceback after the data is loaded."""
    try:
        str(folder).encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"--output_dir {os.fsencode(folder)!r} is not valid UTF-8, which TensorBoard's file "
            "names must be; pass a folder name in UTF-8"
        ) from None


def count_training_steps(args: MnistArguments, batches_per_epoch: int) -> int:
    total = args.epochs * batches_per_epoch
    return min(total, args.max_steps) if args.max_steps > 0 else total


def build_optimizer(model: nn.Module, args: MnistArguments) -> torch.optim.Optimizer:
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=args.momentum)
    return torch.optim.Adam(model.parameters(), lr=args.learning_rate)


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, args: MnistArguments, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """Stepped once per optimizer step."""
    if args.lr_schedule == "onecycle":  # warm-up over OneCycleLR's default 30% of the steps
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=args.learning_rate, total_steps=total_steps
        )
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)


def epoch_record(
    epoch: int, train: Evaluation, val: Evaluation | None, learning_rate: float, epoch_start: float
) -> dict[str, Any]:
    """One entry of metrics.json's history; `val` is None without a validation split,
    `epoch_start` the epoch's `time.perf_counter()` start."""
    return {
        "epoch": epoch,
        "train_loss": train.loss,
        "train_acc": train.accuracy,
        "val_loss": val.loss if val else None,
        "val_acc": val.accuracy if val else None,
        "learning_rate": learning_rate,
        "seconds": round(time.perf_counter() - epoch_start, 3),
    }


def log_epoch(history: list[dict[str, Any]], num_epochs: int) -> None:
    """Where there are no bars, both trainers' line for the last epoch of `history` out of
    `num_epochs`: `epoch 3/10: train loss 0.1234, acc 96.1%, val loss 0.1103, val acc 96.8%,
    12s elapsed, 28s left`."""
    if PROGRESS_BARS:
        return
    record = history[-1]
    parts = [f"epoch {record['epoch']}/{num_epochs}: train loss {record['train_loss']:.4f}"]
    parts.append(f"acc {record['train_acc']:.1%}")
    if record["val_loss"] is not None:
        parts += [f"val loss {record['val_loss']:.4f}", f"val acc {record['val_acc']:.1%}"]
    elapsed = sum(entry["seconds"] for entry in history)
    logger.info(", ".join([*parts, elapsed_and_left(elapsed, len(history), num_epochs)]))


@dataclass
class TrainedModel:
    """What a trainer hands back to be written into the run folder."""

    model: nn.Module
    test: Evaluation
    history: list[dict[str, Any]]  # epoch_record of each epoch
    train_seconds: float


# A trainer: trains on the splits on the device, logging into the run folder.
Fit = Callable[[MnistArguments, DigitSplits, torch.device, Path], TrainedModel]


def run_training(args: MnistArguments, trainer: str, fit: Fit) -> dict[str, Any]:
    """Load the digits, train with `fit` into a new run folder, save the model's weights and
    metrics.json there (the folder appears whole or not at all); return the metrics."""
    device = resolve_device(args.device)
    check_utf8_name(default_output_dir(args, trainer))
    splits = load_digit_splits(args)  # bad input fails here, before anything is written
    with atomic_dir(default_output_dir(args, trainer), overwrite=args.overwrite) as run_dir:
        seed_everything(args.seed, verbose=False)
        trained = fit(args, splits, device, run_dir)
        torch.save(trained.model.state_dict(), run_dir / MNIST_MODEL_FILE)
        metrics = {
            "trainer": trainer,
            "test_accuracy": trained.test.accuracy,
            "test_loss": trained.test.loss,
            "confusion_matrix": trained.test.confusion_matrix.long().tolist(),
            "epochs": len(trained.history),
            "train_seconds": round(trained.train_seconds, 3),
            **splits.sizes,
            "data_source": splits.source,
            "device": str(device),
            "history": trained.history,
            "hardware": hardware_description(),
            "versions": library_versions(),
            "config": dataclasses.asdict(args),
        }
        write_json_atomic(run_dir / MNIST_METRICS_FILE, metrics)
    return metrics


def trainer_main(
    argv: list[str] | None, trainer: str, fit: Fit, description: str, prog: str
) -> int:
    """The command line of one trainer: parse, train, print the result line."""
    (args,) = parse_args([MnistArguments], argv, description=description, prog=prog)
    metrics = run_training(args, trainer, fit)
    shared = metrics["num_test_in_train"]
    also_trained = f" ({shared} of them also training digits)" if shared else ""
    print(
        f"test accuracy {metrics['test_accuracy']:.4f} on {metrics['num_test']} digits"
        f"{also_trained} after "
        f"{metrics['epochs']} epochs ({metrics['train_seconds']:.0f} s of training); "
        f"results in {default_output_dir(args, trainer)}"
    )
    return 0
