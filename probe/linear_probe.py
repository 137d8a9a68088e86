"""The linear probe of a network, and of every checkpoint of a run: the probe curve.

A linear probe keeps the network frozen: each document's pooled final hidden state
(probe/features.py), standardised, feeds a logistic regression (probe/baselines.py). It measures
what the representation tells apart as it is, without training the network, so it is cheap
(one forward pass per document) and answers "what did pretraining put in" directly. The curve
repeats it for the weights the run started from (step 0), each `checkpoint-<step>/` the run
folder still holds and the final model, against the tokens pretraining had read by then.
"""

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sklearn.pipeline import Pipeline
from transformers import GPT2Model

from common.cli import InputError
from probe.baselines import fit_linear_probe
from probe.features import document_features
from probe.metrics import score_predictions
from probe.pretraining_run import PretrainingRun, load_transformer

logger = logging.getLogger(__name__)


@dataclass
class ProbeTask:
    """What every classifier of one probe trains and tests on: token ids, classes, the split."""

    encoded: list[np.ndarray]
    labels: np.ndarray
    train_indices: np.ndarray
    test_indices: np.ndarray
    num_classes: int
    unseen: np.ndarray | None  # per test document: not pretraining training text (None: unknown)
    pooling: str
    pad_token_id: int
    device: torch.device | str

    def score(self, predictions: np.ndarray) -> dict[str, Any]:
        return score_predictions(
            self.labels[self.test_indices], predictions, self.num_classes, self.unseen
        )


def linear_probe(transformer: GPT2Model, task: ProbeTask) -> tuple[Pipeline, dict[str, Any]]:
    """Fit the linear probe on the training split's frozen features, score the test split:
    the fitted standardisation and logistic regression, and the test scores with the seconds."""
    started = time.perf_counter()
    features = document_features(
        transformer, task.encoded, task.pooling, task.pad_token_id, task.device
    )
    probe = fit_linear_probe(features[task.train_indices], task.labels[task.train_indices])
    seconds = time.perf_counter() - started
    scores = task.score(probe.predict(features[task.test_indices]))
    return probe, {**scores, "train_seconds": seconds}


def curve_point(step: int, run: PretrainingRun, model: str, scores: dict[str, Any]) -> dict:
    return {
        "step": step,
        "tokens": step * run.global_batch_tokens,
        "model": model,
        "accuracy": scores["accuracy"],
        "macro_f1": scores["macro_f1"],
    }


def probe_curve(
    run: PretrainingRun,
    task: ProbeTask,
    initial_scores: dict[str, Any],
    final_scores: dict[str, Any],
) -> dict[str, Any]:
    """The linear probe's accuracy at step 0 (`initial_scores`), at each checkpoint folder
    that loads (one warning line for each that does not), and at the final model
    (`final_scores`), by step."""
    checkpoints = run.checkpoints()
    logger.info(
        "probe curve: %d checkpoint folder(s) in %s, plus step 0 and the final model",
        len(checkpoints),
        run.run_dir,
    )
    points = [curve_point(0, run, "random initial weights (the run's seed)", initial_scores)]
    skipped = []
    for step, folder in checkpoints:
        if step in (0, run.final_step):
            continue  # the same weights as a point the curve already has
        try:
            transformer = load_transformer(folder)
        except InputError as err:
            logger.warning("probe curve: skipping %s: %s", folder.name, err)
            skipped.append({"checkpoint": folder.name, "reason": str(err)})
            continue
        _, scores = linear_probe(transformer, task)
        logger.info("probe curve: step %d, linear probe accuracy %.4f", step, scores["accuracy"])
        points.append(curve_point(step, run, folder.name, scores))
    points.append(curve_point(run.final_step, run, "final", final_scores))
    return {
        "method": f"linear probe ({task.pooling} pooling, standardised, logistic regression)",
        "tokens_per_step": run.global_batch_tokens,
        "num_checkpoints_found": len(checkpoints),
        "skipped_checkpoints": skipped,
        "points": points,
    }
