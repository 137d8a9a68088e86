"""Which probe documents the pretraining run read, and whether that leaks into the probe.

Pretraining splits its corpus by document and records the split in the run folder
(`document_split.json`, common/run_contract.py): the keyed hash of every document's text in its
training and its validation split. The probe hashes its own texts with the same key
(`common.corpus.document_hashes`) and looks them up: nothing of pretraining is redone.

The probe puts every pretraining-validation document in its test split. Test documents that
were pretraining training text are counted: pretraining never sees labels, so they leak no
label, but the pretrained network may model these texts better than unseen ones; accuracy on
the test documents pretraining did not train on is reported beside the overall figure.
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.corpus import document_hashes
from common.run_contract import DOCUMENT_SPLIT_FILE

logger = logging.getLogger(__name__)

REPRODUCED = "reproduced"
UNKNOWN = "unknown"


@dataclass
class PretrainingOverlap:
    """Per probe document: was it pretraining validation text, or pretraining training text?"""

    status: str  # REPRODUCED, or UNKNOWN when the run folder does not record its split
    reason: str  # where the split came from, or why it is not known
    in_validation: np.ndarray  # bool per probe document (all False when unknown)
    in_training: np.ndarray


def find_pretraining_overlap(run_dir: Path, texts: list[str]) -> PretrainingOverlap:
    """Match the probe's texts against the run's recorded split; never raises for a run folder
    without a readable record (the result says why)."""
    record_path = run_dir / DOCUMENT_SPLIT_FILE
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        key = record["key"]
        validation = {int(value, 16) for value in record["validation"]}
        training = {int(value, 16) for value in record["train"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        reason = (
            f"{record_path} is missing (a run from before runs recorded their split)"
            if isinstance(err, FileNotFoundError)
            else f"{record_path} cannot be read ({type(err).__name__}: {err})"
        )
        logger.warning("pretraining overlap unknown: %s", reason)
        none = np.zeros(len(texts), bool)
        return PretrainingOverlap(UNKNOWN, reason, none, none.copy())
    hashes = document_hashes(texts, key).tolist()
    return PretrainingOverlap(
        REPRODUCED,
        f"{record_path}: {len(validation)} validation and {len(training)} training documents "
        "of the pretraining corpus, matched by text",
        np.array([value in validation for value in hashes], bool),
        np.array([value in training for value in hashes], bool),
    )


def describe_overlap(overlap: PretrainingOverlap, is_test: np.ndarray) -> dict[str, Any]:
    """The counts and the verdict for the results file."""
    if overlap.status == UNKNOWN:
        return {
            "status": UNKNOWN,
            "reason": overlap.reason,
            "verdict": "Not known which test documents pretraining read (" + overlap.reason + "): "
            "the pretrained model's accuracy may be helped by texts it saw during pretraining "
            "(never their labels, which pretraining does not read).",
        }
    num_test = int(is_test.sum())
    num_validation = int(overlap.in_validation.sum())
    num_validation_in_test = int((overlap.in_validation & is_test).sum())
    num_test_seen = int((overlap.in_training & is_test).sum())
    num_train_seen = int((overlap.in_training & ~is_test).sum())
    validation_sentence = (
        f"{num_validation_in_test} of the {num_validation} probe documents that pretraining "
        "held out for validation are in the test split."
        if num_validation
        else "No probe document was pretraining validation text."
    )
    return {
        "status": REPRODUCED,
        "reason": overlap.reason,
        "num_pretraining_validation_documents": num_validation,
        "num_pretraining_validation_in_test": num_validation_in_test,
        "num_pretraining_training_documents_in_train": num_train_seen,
        "num_pretraining_training_documents_in_test": num_test_seen,
        "num_test_unseen_by_pretraining": num_test - num_test_seen,
        "verdict": (
            f"{validation_sentence} {num_test_seen} of the {num_test} test documents were "
            "pretraining training text: pretraining read their words but never their labels, "
            "so no label leaks; the pretrained model may still know these texts better than "
            "new ones, hence accuracy_unseen_by_pretraining on the other "
            f"{num_test - num_test_seen}."
        ),
    }
