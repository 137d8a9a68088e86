"""Train LeNet-5 on MNIST with Lightning: the same flags and results as `mnist.train`.

    python -m mnist.train_lightning                        # embedded 5k sample, CPU, ~1 minute
    python -m mnist.train_lightning --data_dir data/mnist --on_device_data true   # full MNIST

The model is the plain `LeNet5` module; `LeNet5Module` adds the training system around it
(loss, metrics, optimizer, logging) and `MnistDataModule` the data. Writes <output_dir>/
metrics.json, model.pt and TensorBoard logs (tensorboard/), like the plain trainer.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from common.cli import entry_point, parse_args
from common.files import atomic_dir
from mnist import viz
from mnist.args import MnistArguments
from mnist.data import (
    NUM_CLASSES,
    DigitSplits,
    distort_images,
    load_digit_splits,
    locate_idx_files,
    make_batches,
    normalize_images,
    resolve_data_source,
)
from mnist.experiment import (
    TENSORBOARD_DIR,
    build_lr_scheduler,
    build_optimizer,
    default_output_dir,
    epoch_record,
    resolve_device,
    result_line,
    seed_everything,
    write_run_results,
)
from mnist.model import LeNet5

logger = logging.getLogger(__name__)

TRAINER = "lightning"


class MnistDataModule(L.LightningDataModule):
    """Digits from the embedded sample or IDX files, as DataLoaders or DeviceBatches."""

    def __init__(self, args: MnistArguments) -> None:
        super().__init__()
        self.args = args
        self.splits: DigitSplits | None = None

    def prepare_data(self) -> None:
        # Runs once per machine: the place to download (finding the files is cheap).
        if resolve_data_source(self.args) == "idx":
            locate_idx_files(self.args)

    def setup(self, stage: str | None = None) -> None:
        if self.splits is None:
            self.splits = load_digit_splits(self.args)

    def _device(self) -> torch.device:
        return self.trainer.strategy.root_device if self.trainer else torch.device("cpu")

    def train_dataloader(self):
        return make_batches(
            self.splits.train_images, self.splits.train_labels, self.args, True, self._device()
        )

    def val_dataloader(self):
        return make_batches(
            self.splits.val_images, self.splits.val_labels, self.args, False, self._device()
        )

    def test_dataloader(self):
        return make_batches(
            self.splits.test_images, self.splits.test_labels, self.args, False, self._device()
        )


class LeNet5Module(L.LightningModule):
    """LeNet-5 with cross-entropy, torchmetrics accuracy and the shared TensorBoard logging."""

    def __init__(self, args: MnistArguments) -> None:
        super().__init__()
        self.args = args
        self.model = LeNet5()
        # One loss mean and one accuracy per stage; attributes, not a ModuleDict, because
        # "train" clashes with nn.Module.train.
        for stage in ("train", "val", "test"):
            setattr(self, f"{stage}_loss", MeanMetric())
            setattr(self, f"{stage}_acc", MulticlassAccuracy(NUM_CLASSES, average="micro"))
        self.test_confusion = MulticlassConfusionMatrix(NUM_CLASSES)
        self.history: list[dict[str, Any]] = []
        self.generator: torch.Generator | None = None
        self.epoch_start = 0.0
        self.epoch_learning_rate = 0.0

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    def _common_step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        images, labels = batch
        if stage == "train" and self.generator is not None:
            images = distort_images(images, self.generator)
        logits = self.model(images)
        loss = F.cross_entropy(logits, labels)
        loss_mean = getattr(self, f"{stage}_loss")
        accuracy = getattr(self, f"{stage}_acc")
        loss_mean.update(loss.detach(), weight=len(labels))
        batch_accuracy = accuracy(logits, labels)  # also accumulates the epoch's accuracy
        if stage == "train":
            learning_rate = self.optimizers().optimizer.param_groups[0]["lr"]
            self.log(viz.TRAIN_LOSS, loss, on_step=True, on_epoch=False, prog_bar=True)
            self.log(viz.TRAIN_ACC, batch_accuracy, on_step=True, on_epoch=False)
            self.log(viz.LEARNING_RATE, learning_rate, on_step=True, on_epoch=False)
            self.log(viz.EPOCH_TRAIN_LOSS, loss_mean, on_step=False, on_epoch=True)
            self.log(viz.EPOCH_TRAIN_ACC, accuracy, on_step=False, on_epoch=True)
        else:
            self.log(f"{stage}/loss", loss_mean, on_step=False, on_epoch=True)
            self.log(f"{stage}/acc", accuracy, on_step=False, on_epoch=True, prog_bar=True)
        if stage == "test":
            self.test_confusion.update(logits.argmax(dim=1), labels)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_index: int) -> Tensor:
        return self._common_step(batch, "train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_index: int) -> Tensor:
        return self._common_step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_index: int) -> Tensor:
        return self._common_step(batch, "test")

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model, self.args)
        total_steps = int(self.trainer.estimated_stepping_batches)
        scheduler = build_lr_scheduler(optimizer, self.args, total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def _probe_images(self) -> Tensor:
        splits = self.trainer.datamodule.splits
        digits = splits.test_images[viz.select_probe_digits(splits.test_labels)]
        return normalize_images(digits).to(self.device)

    def on_train_start(self) -> None:
        if self.args.distort:
            self.generator = torch.Generator(self.device).manual_seed(self.args.seed)
        writer = self.logger.experiment
        probe_images = self._probe_images()
        viz.log_model_graph(writer, self.model, probe_images)
        viz.log_layers(writer, self.model, probe_images, step=0)

    def on_train_epoch_start(self) -> None:
        self.epoch_start = time.perf_counter()
        self.epoch_learning_rate = self.optimizers().optimizer.param_groups[0]["lr"]

    def on_train_epoch_end(self) -> None:
        # Runs after this epoch's validation; Lightning logs and resets the train metrics
        # only after this hook, so they still hold the epoch's values here.
        val_loss = self.trainer.callback_metrics.get(viz.VAL_LOSS)
        val_acc = self.trainer.callback_metrics.get(viz.VAL_ACC)
        self.history.append(
            epoch_record(
                self.current_epoch + 1,
                self.train_loss.compute().item(),
                self.train_acc.compute().item(),
                val_loss.item() if val_loss is not None else None,
                val_acc.item() if val_acc is not None else None,
                self.epoch_learning_rate,
                time.perf_counter() - self.epoch_start,
            )
        )
        viz.log_layers(self.logger.experiment, self.model, self._probe_images(), self.global_step)

    def on_train_end(self) -> None:
        splits = self.trainer.datamodule.splits
        projector = viz.select_projector_digits(
            len(splits.test_labels), self.args.num_projector_digits
        )
        viz.log_embedding(
            self.logger.experiment,
            self.model,
            splits.test_images[projector],
            splits.test_labels[projector],
            self.global_step,
        )


def lightning_device(device: torch.device) -> tuple[str, list[int] | int]:
    """Trainer(accelerator=..., devices=...) for one torch device."""
    if device.type == "cuda":
        return "gpu", [device.index or 0]
    return device.type, 1


def train_with_lightning(args: MnistArguments) -> dict[str, Any]:
    """Train, evaluate on the test split, write the run folder; return metrics.json's content."""
    device = resolve_device(args.device)
    datamodule = MnistDataModule(args)
    # Bad input fails here, before Lightning starts or anything is written.
    datamodule.prepare_data()
    datamodule.setup("fit")
    with (
        warnings.catch_warnings(),
        atomic_dir(default_output_dir(args, TRAINER), overwrite=args.overwrite) as run_dir,
    ):
        # The digits are in memory already: worker processes would only add start-up time.
        # Silenced for this run only, not for the rest of the calling process.
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        seed_everything(args.seed)
        module = LeNet5Module(args)
        accelerator, devices = lightning_device(device)
        trainer = L.Trainer(
            accelerator=accelerator,
            devices=devices,
            max_epochs=args.epochs,
            max_steps=args.max_steps,
            logger=TensorBoardLogger(
                save_dir=run_dir, name=TENSORBOARD_DIR, version="", default_hp_metric=False
            ),
            log_every_n_steps=args.log_every_n_steps,
            # The run folder gets model.pt at the end; per-epoch checkpoints would be noise.
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            limit_val_batches=1.0 if len(datamodule.splits.val_labels) else 0,
        )
        start = time.perf_counter()
        trainer.fit(module, datamodule=datamodule)
        train_seconds = time.perf_counter() - start
        (test_results,) = trainer.test(module, datamodule=datamodule, verbose=False)
        return write_run_results(
            run_dir,
            trainer=TRAINER,
            args=args,
            model=module.model,
            test_loss=test_results[viz.TEST_LOSS],
            test_accuracy=test_results[viz.TEST_ACC],
            confusion_matrix=module.test_confusion.compute(),
            history=module.history,
            train_seconds=train_seconds,
            sizes=datamodule.splits.sizes,
            data_source=datamodule.splits.source,
            device=device,
        )


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args(
        [MnistArguments], argv, description=__doc__, prog="python -m mnist.train_lightning"
    )
    metrics = train_with_lightning(args)
    print(result_line(metrics, default_output_dir(args, TRAINER)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
