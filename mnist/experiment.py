"""What a training run needs whichever trainer runs it: device, optimizer and schedule, the
run folder's contents (metrics.json, model.pt)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.cli import InputError
from common.files import write_json_atomic
from common.run_contract import MNIST_METRICS_FILE, MNIST_MODEL_FILE
from common.system import hardware_description, library_versions
from mnist.args import MnistArguments
from mnist.data import DigitSplits
from mnist.metrics import Evaluation

logger = logging.getLogger(__name__)

# OneCycleLR's warm-up share of all steps (its default).
ONECYCLE_WARMUP_FRACTION = 0.3


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
    if args.lr_schedule == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=args.learning_rate,
            total_steps=total_steps,
            pct_start=ONECYCLE_WARMUP_FRACTION,
        )
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)


def epoch_record(
    epoch: int,
    train: Evaluation,
    val: Evaluation | None,
    learning_rate: float,
    seconds: float,
) -> dict[str, Any]:
    """One entry of metrics.json's history; `val` is None without a validation split."""
    return {
        "epoch": epoch,
        "train_loss": train.loss,
        "train_acc": train.accuracy,
        "val_loss": val.loss if val else None,
        "val_acc": val.accuracy if val else None,
        "learning_rate": learning_rate,
        "seconds": round(seconds, 3),
    }


def write_run_results(
    output_dir: Path,
    *,
    trainer: str,
    args: MnistArguments,
    model: nn.Module,
    test: Evaluation,
    history: list[dict[str, Any]],
    train_seconds: float,
    splits: DigitSplits,
    device: torch.device,
) -> dict[str, Any]:
    """Save the model's weights and metrics.json (atomically); return the metrics."""
    torch.save(model.state_dict(), output_dir / MNIST_MODEL_FILE)
    metrics = {
        "trainer": trainer,
        "test_accuracy": test.accuracy,
        "test_loss": test.loss,
        "confusion_matrix": test.confusion_matrix.long().tolist(),
        "epochs": len(history),
        "train_seconds": round(train_seconds, 3),
        **splits.sizes,
        "data_source": splits.source,
        "device": str(device),
        "history": history,
        "hardware": hardware_description(),
        "versions": library_versions(),
        "config": dataclasses.asdict(args),
    }
    write_json_atomic(output_dir / MNIST_METRICS_FILE, metrics)
    return metrics


def result_line(metrics: dict[str, Any], output_dir: Path) -> str:
    """The one line a trainer prints at the end."""
    shared = metrics["num_test_in_train"]
    also_trained = f" ({shared} of them also training digits)" if shared else ""
    return (
        f"test accuracy {metrics['test_accuracy']:.4f} on {metrics['num_test']} digits"
        f"{also_trained} after "
        f"{metrics['epochs']} epochs ({metrics['train_seconds']:.0f} s of training); "
        f"results in {output_dir}"
    )
