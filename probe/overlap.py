"""Which probe documents the pretraining run read, and whether that leaks into the probe.

Pretraining splits its corpus by document (`pretrain.blocks.packing.choose_validation_documents`: a
keyed hash of each text, the validation fraction, at least one block). The run folder's
`run_summary.json` records the corpus inputs, their fingerprint, the split settings and the
number of validation documents, so the split can be redone: read the same corpus again (its
fingerprint must match), tokenize it with the run's tokenizer, choose again, and check that
the count of validation documents is the run's. Documents are then matched by their text.

The probe puts every pretraining-validation document in its test split. Test documents that
were pretraining training text are counted: pretraining never sees labels, so they leak no
label, but the pretrained network may model these texts better than unseen ones; accuracy on
the test documents pretraining did not train on is reported beside the overall figure.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.cli import InputError
from common.corpus import CorpusArguments, corpus_fingerprint, iter_documents
from common.run_contract import GPT_SUMMARY_FILE
from common.tokenization import tokenize_documents
from pretrain.blocks.packing import choose_validation_documents

logger = logging.getLogger(__name__)

REPRODUCED = "reproduced"
UNKNOWN = "unknown"
TOKENIZE_BATCH_SIZE = 1000


@dataclass
class PretrainingOverlap:
    """Per probe document: was it pretraining validation text, or pretraining training text?"""

    status: str  # REPRODUCED, or UNKNOWN when the split could not be redone
    reason: str  # how the split was redone, or why it could not be
    in_validation: np.ndarray  # bool per probe document (all False when unknown)
    in_training: np.ndarray


def find_pretraining_overlap(run_dir: Path, texts: list[str], tokenizer) -> PretrainingOverlap:
    """Redo the run's document split and match the probe's texts against it; never raises for
    a split that cannot be redone (the result says why)."""
    none = np.zeros(len(texts), bool)

    def unknown(reason: str) -> PretrainingOverlap:
        logger.warning("pretraining overlap unknown: %s", reason)
        return PretrainingOverlap(UNKNOWN, reason, none, none.copy())

    summary_path = run_dir / GPT_SUMMARY_FILE
    if not summary_path.is_file():
        return unknown(f"{summary_path} is missing")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    try:
        corpus_args = CorpusArguments(**summary["config"]["CorpusArguments"])
        data = summary["data"]
        settings = data["settings"]
        recorded_fingerprint = data["corpus_fingerprint"]
        num_recorded = data["splits"]["validation"]["num_documents"]
    except (KeyError, TypeError):
        return unknown(f"{summary_path} does not record the pretraining corpus and its split")
    corpus = corpus_args.corpus
    inputs = corpus if isinstance(corpus, str) else ", ".join(corpus)
    try:
        if corpus_fingerprint(corpus_args) != recorded_fingerprint:
            return unknown(f"the pretraining corpus {inputs} has changed since the run")
        documents = list(iter_documents(corpus_args))
    except InputError as err:
        return unknown(f"the pretraining corpus cannot be read from here: {err}")
    _, lengths = tokenize_documents(documents, tokenizer, None, TOKENIZE_BATCH_SIZE)
    is_validation = choose_validation_documents(
        documents,
        lengths,
        settings["validation_fraction"],
        settings["block_size"],
        settings["split_seed"],
    )
    if int(is_validation.sum()) != num_recorded:
        return unknown(
            f"redoing the split of {inputs} gave {int(is_validation.sum())} validation "
            f"documents, the run had {num_recorded} (another tokenizer than final/'s?)"
        )
    validation = {text for text, held_out in zip(documents, is_validation, strict=True) if held_out}
    training = set(documents) - validation
    return PretrainingOverlap(
        REPRODUCED,
        f"split of {inputs} redone (seed {settings['split_seed']}, validation fraction "
        f"{settings['validation_fraction']}): {num_recorded} validation documents, as in the run",
        np.array([text in validation for text in texts], bool),
        np.array([text in training for text in texts], bool),
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
    if num_validation:
        validation_sentence = (
            f"{num_validation_in_test} of the {num_validation} probe documents that pretraining "
            "held out for validation are in the test split."
        )
    else:
        validation_sentence = "No probe document was pretraining validation text."
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
