"""What a training run needs whichever trainer runs it: device, seeding, optimizer and
schedule, the run folder's contents (metrics.json, model.pt)."""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from common.cli import InputError
from common.files import write_json_atomic
from common.system import hardware_description, library_versions
from mnist.args import MnistArguments

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
MODEL_FILE = "model.pt"  # LeNet5 state_dict
TENSORBOARD_DIR = "tensorboard"
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


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) so a run repeats."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
    train_loss: float,
    train_acc: float,
    val_loss: float | None,
    val_acc: float | None,
    learning_rate: float,
    seconds: float,
) -> dict[str, Any]:
    """One entry of metrics.json's history."""
    return {
        "epoch": epoch,
        "train_loss": train_loss,
        "train_acc": train_acc,
        "val_loss": val_loss,
        "val_acc": val_acc,
        "learning_rate": learning_rate,
        "seconds": round(seconds, 3),
    }


def write_run_results(
    output_dir: Path,
    *,
    trainer: str,
    args: MnistArguments,
    model: nn.Module,
    test_loss: float,
    test_accuracy: float,
    confusion_matrix: torch.Tensor,
    history: list[dict[str, Any]],
    train_seconds: float,
    sizes: dict[str, int],
    data_source: str,
    device: torch.device,
) -> dict[str, Any]:
    """Save the model's weights and metrics.json (atomically); return the metrics."""
    torch.save(model.state_dict(), output_dir / MODEL_FILE)
    metrics = {
        "trainer": trainer,
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "confusion_matrix": confusion_matrix.cpu().long().tolist(),
        "epochs": len(history),
        "train_seconds": round(train_seconds, 3),
        **sizes,
        "data_source": data_source,
        "device": str(device),
        "history": history,
        "hardware": hardware_description(),
        "versions": library_versions(),
        "config": dataclasses.asdict(args),
    }
    write_json_atomic(output_dir / METRICS_FILE, metrics)
    return metrics


def result_line(metrics: dict[str, Any], output_dir: Path) -> str:
    """The one line a trainer prints at the end."""
    return (
        f"test accuracy {metrics['test_accuracy']:.4f} on {metrics['num_test']} digits after "
        f"{metrics['epochs']} epochs ({metrics['train_seconds']:.0f} s of training); "
        f"results in {output_dir}"
    )
