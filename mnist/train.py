"""Train LeNet-5 on MNIST with a plain PyTorch loop.

    train-mnist                                  # embedded 5k sample, CPU, ~1 minute
    train-mnist --data_dir data/mnist --on_device_data true   # full MNIST (IDX files)

Writes <output_dir>/metrics.json, model.pt and TensorBoard logs (tensorboard/).
"""

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.tensorboard import SummaryWriter
from tqdm.auto import tqdm

from common.cli import entry_point
from common.run_contract import LEARNING_RATE, TENSORBOARD_DIR, TRAIN_ACC, TRAIN_LOSS
from mnist import viz
from mnist.args import MnistArguments
from mnist.data import DigitSplits, distort_images, make_batches
from mnist.experiment import (
    PROGRESS_BARS,
    TrainedModel,
    build_lr_scheduler,
    build_optimizer,
    count_training_steps,
    epoch_record,
    log_epoch,
    trainer_main,
)
from mnist.metrics import STAGE_TAGS, DigitMetrics, Evaluation
from mnist.model import LeNet5

Batches = Iterable[tuple[Tensor, Tensor]]


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
    progress: bool = PROGRESS_BARS,
) -> Evaluation:
    """One pass over `batches` (at most `max_batches` when positive): the epoch's mean loss and
    accuracy. `generator` turns on random distortions; `on_step(loss, batch_accuracy,
    learning_rate)` gets device tensors after every step, so that it alone decides when to sync."""
    model.train()
    metrics = DigitMetrics().to(device)
    for batch_index, (images, labels) in enumerate(
        tqdm(batches, desc="train", leave=False, disable=not progress)
    ):
        if batch_index == max_batches:
            break
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        if generator is not None:
            images = distort_images(images, generator)
        loss, batch_accuracy = metrics(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        learning_rate = optimizer.param_groups[0]["lr"]  # the rate this step used
        if scheduler is not None:
            scheduler.step()
        if on_step is not None:
            on_step(loss.detach(), batch_accuracy, learning_rate)
    return metrics.compute()


@torch.no_grad()
def evaluate(model: nn.Module, batches: Batches, device: torch.device) -> Evaluation:
    """Mean loss, accuracy and confusion matrix over all `batches`."""
    model.eval()
    metrics = DigitMetrics(with_confusion_matrix=True).to(device)
    for images, labels in batches:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        metrics(model(images), labels)
    return metrics.compute()


def fit(
    args: MnistArguments, splits: DigitSplits, device: torch.device, run_dir: Path
) -> TrainedModel:
    """Train with the plain loop, logging to TensorBoard in `run_dir`; evaluate on the test set."""
    model = LeNet5().to(device)
    train_batches = make_batches(splits.train_images, splits.train_labels, args, True, device)
    val_batches = make_batches(splits.val_images, splits.val_labels, args, False, device)
    test_batches = make_batches(splits.test_images, splits.test_labels, args, False, device)
    total_steps = count_training_steps(args, len(train_batches))
    optimizer = build_optimizer(model, args)
    scheduler = build_lr_scheduler(optimizer, args, total_steps)
    generator = torch.Generator(device).manual_seed(args.seed) if args.distort else None

    writer = SummaryWriter(run_dir / TENSORBOARD_DIR)
    probe_images = viz.log_graph_and_layers(writer, model, splits)
    global_step = 0

    def log_step(loss: Tensor, accuracy: Tensor, learning_rate: float) -> None:
        nonlocal global_step
        global_step += 1
        if global_step % args.log_every_n_steps == 0:
            writer.add_scalar(TRAIN_LOSS, loss.item(), global_step)
            writer.add_scalar(TRAIN_ACC, accuracy.item(), global_step)
            writer.add_scalar(LEARNING_RATE, learning_rate, global_step)

    def log_evaluation(stage: str, evaluation: Evaluation) -> None:
        loss_tag, accuracy_tag = STAGE_TAGS[stage]
        writer.add_scalar(loss_tag, evaluation.loss, global_step)
        writer.add_scalar(accuracy_tag, evaluation.accuracy, global_step)

    history = []
    start = time.perf_counter()
    epochs = tqdm(range(1, args.epochs + 1), desc="epochs", disable=not PROGRESS_BARS)
    for epoch in epochs:
        epoch_start = time.perf_counter()
        learning_rate = optimizer.param_groups[0]["lr"]
        train_epoch = train_one_epoch(
            model,
            train_batches,
            optimizer,
            scheduler,
            device,
            generator=generator,
            on_step=log_step,
            max_batches=total_steps - global_step,
        )
        log_evaluation("train", train_epoch)
        val = evaluate(model, val_batches, device) if len(splits.val_labels) else None
        if val is not None:
            log_evaluation("val", val)
        viz.log_layers(writer, model, probe_images, global_step)
        history.append(epoch_record(epoch, train_epoch, val, learning_rate, epoch_start))
        log_epoch(history, -(-total_steps // len(train_batches)))  # max_steps may cut epochs
        epochs.set_postfix(
            loss=f"{train_epoch.loss:.3f}", val_acc=f"{val.accuracy:.3f}" if val else "-"
        )
        if global_step >= total_steps:
            break
    train_seconds = time.perf_counter() - start

    viz.log_embedding(writer, model, splits, args.num_projector_digits, global_step)
    test = evaluate(model, test_batches, device)
    log_evaluation("test", test)
    writer.close()
    return TrainedModel(model, test, history, train_seconds)


@entry_point
def main(argv: list[str] | None = None) -> int:
    return trainer_main(argv, "pytorch", fit, __doc__, "train-mnist")


if __name__ == "__main__":
    raise SystemExit(main())
