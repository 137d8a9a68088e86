"""The numbers both trainers report, computed by the same torchmetrics objects.

The plain loop and the Lightning module each keep one `DigitMetrics` per stage and feed it
every batch, so metrics.json means the same thing whichever trainer wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from mnist.model import NUM_CLASSES


@dataclass
class Evaluation:
    loss: float
    accuracy: float
    confusion_matrix: Tensor | None  # (10, 10) counts on the CPU, rows = true digit


class DigitMetrics(nn.Module):
    """Mean loss, accuracy and, when asked, the confusion matrix over a stream of batches.

    The submodules are torchmetrics metrics, so Lightning can log `loss` and `accuracy`
    directly (it computes and resets logged metrics at each epoch's end).
    """

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

    def forward(self, logits: Tensor, labels: Tensor, digit_losses: Tensor) -> Tensor:
        """Add one batch (logits (N, 10), labels (N,), unreduced losses (N,)); return the
        batch's accuracy as a device tensor, so the caller decides when to sync."""
        predictions = logits.detach().argmax(dim=1)
        self.loss.update(digit_losses.detach())
        if self.confusion_matrix is not None:
            self.confusion_matrix.update(predictions, labels)
        return self.accuracy(predictions, labels)

    def compute(self) -> Evaluation:
        confusion = self.confusion_matrix
        return Evaluation(
            loss=self.loss.compute().item(),
            accuracy=self.accuracy.compute().item(),
            confusion_matrix=confusion.compute().cpu() if confusion is not None else None,
        )
