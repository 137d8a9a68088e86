"""The numbers both trainers report, computed by the same torchmetrics objects.

The plain loop and the Lightning module each keep one `DigitMetrics` per stage and feed it
every batch, so metrics.json means the same thing whichever trainer wrote it.
"""

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from common.run_contract import (
    EPOCH_TRAIN_ACC,
    EPOCH_TRAIN_LOSS,
    TEST_ACC,
    TEST_LOSS,
    VAL_ACC,
    VAL_LOSS,
)
from mnist.model import NUM_CLASSES

# The TensorBoard tags of each stage's (loss, accuracy) over an epoch, in both trainers.
STAGE_TAGS = {
    "train": (EPOCH_TRAIN_LOSS, EPOCH_TRAIN_ACC),
    "val": (VAL_LOSS, VAL_ACC),
    "test": (TEST_LOSS, TEST_ACC),
}


@dataclass
class Evaluation:
    loss: float
    accuracy: float
    confusion_matrix: Tensor | None  # (10, 10) counts on the CPU, rows = true digit


class DigitMetrics(nn.Module):
    """Mean loss, accuracy and, when asked, the confusion matrix over a stream of batches, as
    torchmetrics submodules: Lightning logs `loss` and `accuracy` directly (it computes and
    resets logged metrics at each epoch's end)."""

    def __init__(self, with_confusion_matrix: bool = False) -> None:
        super().__init__()
        # No NaN check and no argument validation: each costs a host sync per batch on a
        # GPU, and the inputs are our own model's logits and our own labels. With
        # nan_strategy="disable" MeanMetric ignores `weight`, so it gets one loss per digit.
        self.loss = MeanMetric(nan_strategy="disable")
        self.accuracy = MulticlassAccuracy(NUM_CLASSES, average="micro", validate_args=False)
        self.confusion_matrix = (
            MulticlassConfusionMatrix(NUM_CLASSES, validate_args=False)
            if with_confusion_matrix
            else None
        )

    def forward(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Add one batch (logits (N, 10), labels (N,)); return its mean cross-entropy loss (to
        backpropagate) and its accuracy, device tensors, so the caller decides when to sync."""
        digit_losses = F.cross_entropy(logits, labels, reduction="none")
        predictions = logits.detach().argmax(dim=1)
        self.loss.update(digit_losses.detach())
        if self.confusion_matrix is not None:
            self.confusion_matrix.update(predictions, labels)
        return digit_losses.mean(), self.accuracy(predictions, labels)

    def compute(self) -> Evaluation:
        confusion = self.confusion_matrix
        return Evaluation(
            loss=self.loss.compute().item(),
            accuracy=self.accuracy.compute().item(),
            confusion_matrix=confusion.compute().cpu() if confusion is not None else None,
        )
