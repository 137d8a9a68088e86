"""Scores of a classifier on the test split (scikit-learn's metrics) and the chance levels."""

from typing import Any

import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score


def score_predictions(
    labels: np.ndarray, predictions: np.ndarray, num_classes: int, unseen: np.ndarray | None
) -> dict[str, Any]:
    """Accuracy, macro-F1 (over the classes present in the test split: a class absent from it
    has no F1) and the confusion matrix (rows: true class, columns: predicted class, all
    `num_classes`); with `unseen`, a mask of the test documents pretraining did not train on,
    the accuracy on those too."""
    scores: dict[str, Any] = {
        "accuracy": float(accuracy_score(labels, predictions)),
        "macro_f1": float(
            f1_score(
                labels, predictions, labels=np.unique(labels), average="macro", zero_division=0
            )
        ),
        "confusion_matrix": confusion_matrix(
            labels, predictions, labels=np.arange(num_classes)
        ).tolist(),
    }
    if unseen is not None:
        scores["num_unseen_by_pretraining"] = int(unseen.sum())
        scores["accuracy_unseen_by_pretraining"] = (
            float(accuracy_score(labels[unseen], predictions[unseen])) if unseen.any() else None
        )
    return scores


def chance_levels(train_labels: np.ndarray, test_labels: np.ndarray, num_classes: int) -> dict:
    """What ignoring the text scores: always the most frequent training class, or a uniform pick."""
    majority = np.bincount(train_labels, minlength=num_classes).argmax()
    return {
        "majority_class": int(majority),
        "majority_class_accuracy": float(np.mean(test_labels == majority)),
        "uniform_accuracy": 1.0 / num_classes,
    }
