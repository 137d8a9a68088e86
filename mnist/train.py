"""Train LeNet-5 on MNIST with a plain PyTorch loop.

    python -m mnist.train                                  # embedded 5k sample, CPU, ~1 minute
    python -m mnist.train --data_dir data/mnist --on_device_data true   # full MNIST (IDX files)

Writes <output_dir>/metrics.json, model.pt and TensorBoard logs (tensorboard/).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.tensorboard import SummaryWriter
from tqdm.auto import tqdm

from common.cli import entry_point, parse_args
from common.files import atomic_dir
from mnist import viz
from mnist.args import MnistArguments
from mnist.data import (
    NUM_CLASSES,
    distort_images,
    load_digit_splits,
    make_batches,
    normalize_images,
)
from mnist.experiment import (
    TENSORBOARD_DIR,
    build_lr_scheduler,
    build_optimizer,
    count_training_steps,
    default_output_dir,
    epoch_record,
    resolve_device,
    result_line,
    seed_everything,
    write_run_results,
)
from mnist.model import LeNet5

logger = logging.getLogger(__name__)

TRAINER = "pytorch"
Batches = Iterable[tuple[Tensor, Tensor]]


@dataclass
class Evaluation:
    loss: float
    accuracy: float
    confusion_matrix: Tensor  # (10, 10) counts, rows = true label, columns = prediction


def train_one_epoch(
    model: nn.Module,
    batches: Batches,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    device: torch.device,
    *,
    generator: torch.Generator | None = None,
    on_step: Callable[[Tensor, Tensor, float], None] | None = None,
    max_batches: int = -1,
    progress: bool = True,
) -> tuple[float, float]:
    """One pass over `batches` (at most `max_batches` when positive); (mean loss, accuracy).

    `generator` turns on random distortions; `on_step(loss, batch_accuracy, learning_rate)`
    gets device tensors after every optimizer step, so that it alone decides when to sync.
    `progress` shows a progress bar over the batches.
    """
    model.train()
    loss_sum = torch.zeros((), device=device)
    num_correct = torch.zeros((), device=device, dtype=torch.long)
    num_digits = 0
    for batch_index, (images, labels) in enumerate(
        tqdm(batches, desc="train", leave=False, disable=not progress)
    ):
        if batch_index == max_batches:
            break
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        if generator is not None:
            images = distort_images(images, generator)
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        learning_rate = optimizer.param_groups[0]["lr"]  # the rate this step used
        if scheduler is not None:
            scheduler.step()
        correct = (logits.argmax(dim=1) == labels).sum()
        loss_sum += loss.detach() * len(labels)
        num_correct += correct
        num_digits += len(labels)
        if on_step is not None:
            on_step(loss.detach(), correct / len(labels), learning_rate)
    return (loss_sum / num_digits).item(), (num_correct / num_digits).item()


@torch.no_grad()
def evaluate(model: nn.Module, batches: Batches, device: torch.device) -> Evaluation:
    """Mean loss, accuracy and confusion matrix over all `batches`."""
    model.eval()
    loss_sum = torch.zeros((), device=device)
    confusion = torch.zeros(NUM_CLASSES * NUM_CLASSES, device=device, dtype=torch.long)
    for images, labels in batches:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        logits = model(images)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum")
        pairs = labels * NUM_CLASSES + logits.argmax(dim=1)
        confusion += torch.bincount(pairs, minlength=NUM_CLASSES * NUM_CLASSES)
    confusion = confusion.reshape(NUM_CLASSES, NUM_CLASSES).cpu()
    num_digits = int(confusion.sum())
    return Evaluation(
        loss=loss_sum.item() / num_digits,
        accuracy=int(confusion.trace()) / num_digits,
        confusion_matrix=confusion,
    )


def train(args: MnistArguments) -> dict[str, Any]:
    """Train, evaluate on the test split, write the run folder; return metrics.json's content."""
    device = resolve_device(args.device)
    splits = load_digit_splits(args)  # bad input fails here, before anything is written
    with atomic_dir(default_output_dir(args, TRAINER), overwrite=args.overwrite) as run_dir:
        seed_everything(args.seed)
        model = LeNet5().to(device)
        train_batches = make_batches(
            splits.train_images, splits.train_labels, args, training=True, device=device
        )
        val_batches = make_batches(
            splits.val_images, splits.val_labels, args, training=False, device=device
        )
        test_batches = make_batches(
            splits.test_images, splits.test_labels, args, training=False, device=device
        )
        total_steps = count_training_steps(args, len(train_batches))
        optimizer = build_optimizer(model, args)
        scheduler = build_lr_scheduler(optimizer, args, total_steps)
        generator = torch.Generator(device).manual_seed(args.seed) if args.distort else None
        probe_images = normalize_images(
            splits.test_images[viz.select_probe_digits(splits.test_labels)]
        ).to(device)

        writer = SummaryWriter(run_dir / TENSORBOARD_DIR)
        viz.log_model_graph(writer, model, probe_images)
        viz.log_layers(writer, model, probe_images, step=0)
        global_step = 0

        def log_step(loss: Tensor, accuracy: Tensor, learning_rate: float) -> None:
            nonlocal global_step
            global_step += 1
            if global_step % args.log_every_n_steps == 0:
                writer.add_scalar(viz.TRAIN_LOSS, loss.item(), global_step)
                writer.add_scalar(viz.TRAIN_ACC, accuracy.item(), global_step)
                writer.add_scalar(viz.LEARNING_RATE, learning_rate, global_step)

        history = []
        start = time.perf_counter()
        epochs = tqdm(range(1, args.epochs + 1), desc="epochs")
        for epoch in epochs:
            epoch_start = time.perf_counter()
            learning_rate = optimizer.param_groups[0]["lr"]
            train_loss, train_acc = train_one_epoch(
                model,
                train_batches,
                optimizer,
                scheduler,
                device,
                generator=generator,
                on_step=log_step,
                max_batches=total_steps - global_step,
            )
            writer.add_scalar(viz.EPOCH_TRAIN_LOSS, train_loss, global_step)
            writer.add_scalar(viz.EPOCH_TRAIN_ACC, train_acc, global_step)
            val = evaluate(model, val_batches, device) if len(splits.val_labels) else None
            if val is not None:
                writer.add_scalar(viz.VAL_LOSS, val.loss, global_step)
                writer.add_scalar(viz.VAL_ACC, val.accuracy, global_step)
            viz.log_layers(writer, model, probe_images, global_step)
            history.append(
                epoch_record(
                    epoch,
                    train_loss,
                    train_acc,
                    val.loss if val else None,
                    val.accuracy if val else None,
                    learning_rate,
                    time.perf_counter() - epoch_start,
                )
            )
            epochs.set_postfix(
                loss=f"{train_loss:.3f}", val_acc=f"{val.accuracy:.3f}" if val else "-"
            )
            if global_step >= total_steps:
                break
        train_seconds = time.perf_counter() - start

        projector = viz.select_projector_digits(len(splits.test_labels), args.num_projector_digits)
        viz.log_embedding(
            writer, model, splits.test_images[projector], splits.test_labels[projector], global_step
        )
        test = evaluate(model, test_batches, device)
        writer.add_scalar(viz.TEST_LOSS, test.loss, global_step)
        writer.add_scalar(viz.TEST_ACC, test.accuracy, global_step)
        writer.close()
        return write_run_results(
            run_dir,
            trainer=TRAINER,
            args=args,
            model=model,
            test_loss=test.loss,
            test_accuracy=test.accuracy,
            confusion_matrix=test.confusion_matrix,
            history=history,
            train_seconds=train_seconds,
            sizes=splits.sizes,
            data_source=splits.source,
            device=device,
        )


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args([MnistArguments], argv, description=__doc__, prog="python -m mnist.train")
    metrics = train(args)
    print(result_line(metrics, default_output_dir(args, TRAINER)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
