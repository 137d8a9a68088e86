"""How well does a pretrained run classify Web of Science abstracts? Fine-tune and compare.

    python -m probe.run --run_dir runs/gpt2_117m --corpus data/WebOfScience.zip \\
        --config probe/configs/gpt2_117m.yaml [--label_level domain|area|combined]
    python -m probe.run --config probe/configs/tiny.yaml       # the demo run, CPU, seconds

Three classifiers on the same split of the labelled documents (probe/data.py), the same
tokens and, for the two networks, the same budget (ProbeTrainingArguments: by default one
epoch, 256 tokens per document): the run's final/ GPT-2 fine-tuned as a sequence classifier
(`pretrained`), the same network from random weights (`random_init`: what pretraining bought)
and TF-IDF + logistic regression (`tfidf`). Accuracy, macro-F1 and confusion matrices, the
split and its overlap with the pretraining split (probe/overlap.py) go to
RUN_DIR/probe/<label_level>.json, written last.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from common.cli import InputError, entry_point, parse_args
from common.corpus import CorpusArguments
from common.files import write_json_atomic
from common.run_contract import (
    FINAL_MODEL_DIR,
    PROBE_DIR,
    PROBE_METHODS,
    PROBE_PRETRAINED,
    PROBE_RANDOM_INIT,
    PROBE_TFIDF,
    PROBE_VERSION,
)
from common.system import hardware_description, library_versions
from common.tokenization import load_tokenizer
from probe.args import ProbeArguments, ProbeCommand, ProbeTrainingArguments
from probe.baselines import tfidf_logistic_regression
from probe.classifier import build_classifier, fine_tune_and_predict, load_model_config
from probe.data import (
    LABEL_FILES,
    classification_dataset,
    encode_documents,
    load_probe_documents,
    split_documents,
)
from probe.metrics import chance_levels, score_predictions
from probe.overlap import REPRODUCED, describe_overlap, find_pretraining_overlap

logger = logging.getLogger(__name__)

METHOD_DESCRIPTIONS = {
    PROBE_PRETRAINED: "GPT-2 from the run's final/ weights, fine-tuned as a classifier",
    PROBE_RANDOM_INIT: "the same GPT-2 from random weights, same fine-tuning budget",
    PROBE_TFIDF: "TF-IDF (words and word pairs) + logistic regression",
}


def parse_probe_args(argv: list[str] | None = None) -> ProbeCommand:
    return ProbeCommand(
        *parse_args(
            [ProbeArguments, CorpusArguments, ProbeTrainingArguments],
            argv,
            description=__doc__,
            prog="python -m probe.run",
        )
    )


def results_path(run_dir: str | Path, label_level: str) -> Path:
    return Path(run_dir) / PROBE_DIR / f"{label_level}.json"


def run_probe(command: ProbeCommand) -> dict[str, Any]:
    """Check the inputs, split, train and test every method, write and return the results."""
    started = time.perf_counter()
    probe, corpus_args, training_args = command
    config = command.to_dict()  # before the Trainer's scratch folder is filled in
    run_dir = Path(probe.run_dir)
    model_dir = run_dir / FINAL_MODEL_DIR
    if not (model_dir / "config.json").is_file():
        raise InputError(
            f"{run_dir} has no {FINAL_MODEL_DIR}/ model (what a finished pretraining run "
            "saves last); pass the folder of a finished run of pretrain/run.py as --run_dir"
        )
    output_path = results_path(run_dir, probe.label_level)
    if output_path.exists() and not probe.overwrite:
        raise InputError(f"{output_path} already exists; pass --overwrite to replace it")
    model_config = load_model_config(model_dir)
    if probe.max_length > model_config.n_positions:
        raise InputError(
            f"--max_length {probe.max_length} is above the model's {model_config.n_positions} "
            "positions; lower it"
        )
    tokenizer = load_tokenizer(model_dir)
    # Without a pad token (e.g. GPT-2's own tokenizer) pads are end-of-text: the head then
    # reads each document's last word instead of the end-of-text after it.
    pad_token_id = tokenizer.pad_token_id
    if pad_token_id is None:
        pad_token_id = tokenizer.eos_token_id
        tokenizer.pad_token = tokenizer.eos_token
    documents = load_probe_documents(corpus_args, probe.label_level, probe.label_names_file)

    overlap = find_pretraining_overlap(run_dir, documents.texts)
    is_test = split_documents(
        documents.texts,
        documents.labels,
        probe.test_fraction,
        probe.split_seed,
        forced_test=overlap.in_validation,
    )
    train_indices, test_indices = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    train_labels, test_labels = documents.labels[train_indices], documents.labels[test_indices]
    unseen = ~overlap.in_training[test_indices] if overlap.status == REPRODUCED else None
    logger.info("%d training and %d test documents", len(train_indices), len(test_indices))

    encoded = encode_documents(documents.texts, tokenizer, probe.max_length)
    methods: dict[str, dict[str, Any]] = {}
    for method in (m for m in PROBE_METHODS if m in probe.methods):
        logger.info("%s: %s", method, METHOD_DESCRIPTIONS[method])
        if method == PROBE_TFIDF:
            predictions, seconds = tfidf_logistic_regression(
                [documents.texts[i] for i in train_indices],
                train_labels,
                [documents.texts[i] for i in test_indices],
            )
            extra: dict[str, Any] = {"train_seconds": seconds}
        else:
            model = build_classifier(
                model_dir,
                documents.class_names,
                pad_token_id,
                pretrained=method == PROBE_PRETRAINED,
                seed=training_args.seed,
            )
            outcome = fine_tune_and_predict(
                model,
                tokenizer,
                classification_dataset(encoded, documents.labels, train_indices),
                classification_dataset(encoded, documents.labels, test_indices),
                training_args,
            )
            predictions = outcome.predictions
            extra = {
                "train_seconds": outcome.train_seconds,
                "num_steps": outcome.num_steps,
                "train_losses": outcome.train_losses,
            }
        methods[method] = {
            "description": METHOD_DESCRIPTIONS[method],
            **score_predictions(test_labels, predictions, documents.num_classes, unseen),
            **extra,
        }
        logger.info("%s: test accuracy %.4f", method, methods[method]["accuracy"])

    results = {
        "probe_version": PROBE_VERSION,
        "run_dir": str(run_dir.resolve()),
        "corpus": documents.source,
        "label_level": probe.label_level,
        "label_files": list(LABEL_FILES[probe.label_level]),
        "class_names": documents.class_names,
        "label_names_source": documents.label_names_source,
        "num_documents": len(documents.texts),
        "num_train": len(train_indices),
        "num_test": len(test_indices),
        "class_counts": {
            "train": np.bincount(train_labels, minlength=documents.num_classes).tolist(),
            "test": np.bincount(test_labels, minlength=documents.num_classes).tolist(),
        },
        "split": {
            "rule": "per class: pretraining-validation documents first, then by a hash of the "
            "text keyed by split_seed; the first round(test_fraction x class size) (at least "
            "one, at most all but one) are test",
            "test_fraction": probe.test_fraction,
            "split_seed": probe.split_seed,
        },
        "chance": chance_levels(train_labels, test_labels, documents.num_classes),
        "pretraining_overlap": describe_overlap(overlap, is_test),
        "budget": {
            "max_length": probe.max_length,
            "num_train_epochs": training_args.num_train_epochs,
            "learning_rate": training_args.learning_rate,
            "train_tokens_per_epoch": int(sum(len(encoded[i]) for i in train_indices)),
            "test_tokens": int(sum(len(encoded[i]) for i in test_indices)),
        },
        "methods": methods,
        "wall_seconds": time.perf_counter() - started,
        "hardware": hardware_description(),
        "versions": library_versions(),
        "config": config,
    }
    write_json_atomic(output_path, results)
    return results


def format_results(results: dict[str, Any]) -> str:
    """The results as a few lines of text: one per method, then the chance levels."""
    lines = [
        f"{results['label_level']}: {len(results['class_names'])} classes, "
        f"{results['num_train']} training / {results['num_test']} test documents",
        f"{'method':<12} {'accuracy':>9} {'macro-F1':>9} {'seconds':>9}",
    ]
    for method, scores in results["methods"].items():
        lines.append(
            f"{method:<12} {scores['accuracy']:>9.4f} {scores['macro_f1']:>9.4f} "
            f"{scores['train_seconds']:>9.1f}"
        )
    chance = results["chance"]
    lines.append(
        f"chance: {chance['majority_class_accuracy']:.4f} (most frequent class), "
        f"{chance['uniform_accuracy']:.4f} (uniform)"
    )
    return "\n".join(lines)


@entry_point
def main(argv: list[str] | None = None) -> int:
    results = run_probe(parse_probe_args(argv))
    print(format_results(results))
    print(f"results: {results_path(results['run_dir'], results['label_level'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
