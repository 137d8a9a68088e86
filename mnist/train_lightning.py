"""Train LeNet-5 on MNIST with Lightning: the same flags and results as `mnist.train`.

    train-mnist-lightning                        # embedded 5k sample, CPU, ~1 minute
    train-mnist-lightning --data_dir data/mnist --on_device_data true   # full MNIST

The model is the plain `LeNet5` module; `LeNet5Module` adds the training system around it
(loss, metrics, optimizer, logging), `MnistDataModule` the data, and two callbacks the side
work: `EpochHistory` (metrics.json's history) and `LayerViews` (TensorBoard's layer views).
Writes <output_dir>/metrics.json, model.pt and TensorBoard logs (tensorboard/), like the plain
trainer.
"""

import logging
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.warnings import PossibleUserWarning
from lightning.pytorch.loggers import TensorBoardLogger
from lightning_utilities.core import rank_zero as lightning_rank_zero
from torch import Tensor

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
    epoch_record,
    log_epoch,
    trainer_main,
)
from mnist.metrics import STAGE_TAGS, DigitMetrics, Evaluation
from mnist.model import LeNet5


class MnistDataModule(L.LightningDataModule):
    """The digits (loaded before Lightning starts, so that bad input fails before anything is
    written), as DataLoaders or DeviceBatches on the trainer's device."""

    def __init__(self, args: MnistArguments, splits: DigitSplits) -> None:
        super().__init__()
        self.args = args
        self.splits = splits

    def _batches(self, split: str, training: bool):
        images = getattr(self.splits, f"{split}_images")
        labels = getattr(self.splits, f"{split}_labels")
        return make_batches(images, labels, self.args, training, self.trainer.strategy.root_device)

    def train_dataloader(self):
        return self._batches("train", True)

    def val_dataloader(self):
        return self._batches("val", False)

    def test_dataloader(self):
        return self._batches("test", False)


class LeNet5Module(L.LightningModule):
    """LeNet-5 with cross-entropy, the shared torchmetrics metrics and an optimizer."""

    def __init__(self, args: MnistArguments) -> None:
        super().__init__()
        self.args = args
        self.model = LeNet5()
        # One set per stage; attributes, not a ModuleDict, because "train" clashes with
        # nn.Module.train.
        self.train_metrics = DigitMetrics()
        self.val_metrics = DigitMetrics()
        self.test_metrics = DigitMetrics(with_confusion_matrix=True)
        self.test_evaluation: Evaluation | None = None
        self.generator: torch.Generator | None = None
        # One digit: Lightning's model summary counts the FLOPs of a forward over it.
        self.example_input_array = torch.zeros(1, 1, 28, 28)

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    def _common_step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        images, labels = batch
        if stage == "train" and self.generator is not None:
            images = distort_images(images, self.generator)
        metrics = getattr(self, f"{stage}_metrics")
        loss, batch_accuracy = metrics(self.model(images), labels)
        if stage == "train":
            learning_rate = self.optimizers().optimizer.param_groups[0]["lr"]
            self.log(TRAIN_LOSS, loss, on_step=True, on_epoch=False, prog_bar=True)
            self.log(TRAIN_ACC, batch_accuracy, on_step=True, on_epoch=False)
            self.log(LEARNING_RATE, learning_rate, on_step=True, on_epoch=False)
        loss_tag, accuracy_tag = STAGE_TAGS[stage]
        self.log(loss_tag, metrics.loss, on_step=False, on_epoch=True)
        self.log(
            accuracy_tag, metrics.accuracy, on_step=False, on_epoch=True, prog_bar=stage != "train"
        )
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_index: int) -> Tensor:
        return self._common_step(batch, "train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_index: int) -> Tensor:
        return self._common_step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_index: int) -> Tensor:
        return self._common_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        # Lightning resets the logged metrics right after this hook.
        self.test_evaluation = self.test_metrics.compute()

    def on_train_start(self) -> None:
        if self.args.distort:
            self.generator = torch.Generator(self.device).manual_seed(self.args.seed)

    def configure_optimizers(self) -> tuple[list[torch.optim.Optimizer], list[dict[str, Any]]]:
        optimizer = build_optimizer(self.model, self.args)
        total_steps = int(self.trainer.estimated_stepping_batches)
        scheduler = build_lr_scheduler(optimizer, self.args, total_steps)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


class EpochHistory(L.Callback):
    """metrics.json's history: per epoch, the training and validation metrics, the learning
    rate the epoch started with and its seconds."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.val: Evaluation | None = None
        self.epoch_start = 0.0
        self.learning_rate = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: LeNet5Module) -> None:
        self.epoch_start = time.perf_counter()
        self.learning_rate = trainer.optimizers[0].param_groups[0]["lr"]
        self.val = None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: LeNet5Module) -> None:
        # Before Lightning computes and resets the logged validation metrics.
        self.val = pl_module.val_metrics.compute()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: LeNet5Module) -> None:
        # After this epoch's validation, before Lightning resets the logged train metrics.
        epoch, train = trainer.current_epoch + 1, pl_module.train_metrics.compute()
        self.history.append(
            epoch_record(epoch, train, self.val, self.learning_rate, self.epoch_start)
        )
        if trainer.is_global_zero:  # max_steps may cut the epochs
            steps_per_epoch = trainer.num_training_batches
            log_epoch(self.history, -(-int(trainer.estimated_stepping_batches) // steps_per_epoch))


class LayerViews(L.Callback):
    """The TensorBoard views of `mnist.viz`: the graph and the layers before training, the
    layers after each epoch, the projector embedding at the end."""

    probe_images: Tensor | None = None  # the digits whose feature maps are shown, once chosen

    def on_train_start(self, trainer: L.Trainer, pl_module: LeNet5Module) -> None:
        self.probe_images = viz.log_graph_and_layers(
            trainer.logger.experiment, pl_module.model, trainer.datamodule.splits
        )

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: LeNet5Module) -> None:
        viz.log_layers(
            trainer.logger.experiment, pl_module.model, self.probe_images, trainer.global_step
        )

    def on_train_end(self, trainer: L.Trainer, pl_module: LeNet5Module) -> None:
        viz.log_embedding(
            trainer.logger.experiment,
            pl_module.model,
            trainer.datamodule.splits,
            pl_module.args.num_projector_digits,
            trainer.global_step,
        )


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence, for one run only, the lines Lightning prints that do not apply to it."""
    # Lightning's info lines: the GPU/TPU banner, where a loop stopped, a cloud logger's
    # advert. One process on one device told exactly what to do needs none of them; its
    # warnings (the warnings module) still show.
    info_logger = lightning_rank_zero.log
    level = info_logger.level
    with warnings.catch_warnings():
        # The digits are in memory already: worker processes would only add start-up time.
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        # One process on one device: never a parallel job that srun should launch.
        warnings.filterwarnings("ignore", "The `srun` command is available", PossibleUserWarning)
        # Lightning 2.6.6 calls a torch pytree API that newer torch deprecates: not ours to fix.
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")
        info_logger.setLevel(logging.WARNING)
        try:
            yield
        finally:
            info_logger.setLevel(level)


def fit(
    args: MnistArguments, splits: DigitSplits, device: torch.device, run_dir: Path
) -> TrainedModel:
    """Train with Lightning, logging to TensorBoard in `run_dir`; evaluate on the test set."""
    datamodule = MnistDataModule(args, splits)
    with quiet_lightning():
        module = LeNet5Module(args)
        history = EpochHistory()
        trainer = L.Trainer(
            accelerator=device.type,
            devices=[device.index or 0] if device.type == "cuda" else 1,
            max_epochs=args.epochs,
            max_steps=args.max_steps,
            logger=TensorBoardLogger(
                save_dir=run_dir, name=TENSORBOARD_DIR, version="", default_hp_metric=False
            ),
            callbacks=[history, LayerViews()],
            log_every_n_steps=args.log_every_n_steps,
            # The run folder gets model.pt at the end; per-epoch checkpoints would be noise.
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            enable_progress_bar=PROGRESS_BARS,
            limit_val_batches=None if len(splits.val_labels) else 0,
        )
        start = time.perf_counter()
        try:
            trainer.fit(module, datamodule=datamodule)
        except SystemExit:
            if trainer.interrupted:  # Lightning ends Ctrl-C with exit 1; the others end it as 130
                raise KeyboardInterrupt from None
            raise
        train_seconds = time.perf_counter() - start
        trainer.test(module, datamodule=datamodule, verbose=False)
    return TrainedModel(module.model, module.test_evaluation, history.history, train_seconds)


@entry_point
def main(argv: list[str] | None = None) -> int:
    return trainer_main(argv, "lightning", fit, __doc__, "train-mnist-lightning")


if __name__ == "__main__":
    raise SystemExit(main())
