"""How well does a pretrained run classify Web of Science abstracts? Probe and compare.

    probe-classifier --run_dir runs/gpt2_117m --corpus data/WebOfScience.zip \\
        --config probe/configs/gpt2_117m.yaml [--label_level domain|area|combined]

Five classifiers on the same split of the labelled documents (probe/data.py) and the same
tokens: the run's final/ GPT-2 and the network the run started from (its shape, random
weights drawn with its seed), each read by a linear probe of its frozen features
(`pretrained_linear`, `random_init_linear`) and fine-tuned from that probe with the same
budget (`pretrained`, `random_init`: what pretraining bought); and TF-IDF + logistic
regression (`tfidf`). The curve repeats the linear probe for every checkpoint the run folder
holds. Accuracy, macro-F1 and confusion matrices, the verdict on what pretraining bought, the
curve, the split and its overlap with the pretraining split (probe/overlap.py) go to
RUN_DIR/probe/<label_level>.json, written last.
"""

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from common.cli import InputError, entry_point, parse_args
from common.corpus import CorpusArguments
from common.files import write_json_atomic
from common.run_contract import (
    PROBE_DIR,
    PROBE_METHODS,
    PROBE_PRETRAINED,
    PROBE_PRETRAINED_LINEAR,
    PROBE_RANDOM_INIT,
    PROBE_RANDOM_INIT_LINEAR,
    PROBE_TFIDF,
    PROBE_VERSION,
)
from common.system import hardware_description, library_versions
from common.tokenization import load_tokenizer
from probe.args import DEFAULT_MAX_LENGTH, ProbeArguments, ProbeCommand, ProbeTrainingArguments
from probe.baselines import tfidf_logistic_regression
from probe.classifier import PooledClassifier, fine_tune_and_predict
from probe.data import (
    LABEL_FILES,
    classification_dataset,
    encode_documents,
    load_probe_documents,
    split_documents,
)
from probe.linear_probe import ProbeTask, linear_probe, probe_curve
from probe.metrics import chance_levels
from probe.overlap import REPRODUCED, describe_overlap, find_pretraining_overlap
from probe.pretraining_run import (
    PretrainingRun,
    initial_transformer,
    load_transformer,
    read_pretraining_run,
)

logger = logging.getLogger(__name__)

METHOD_DESCRIPTIONS = {
    PROBE_PRETRAINED: "GPT-2 from the run's final/ weights, fine-tuned from its linear probe",
    PROBE_RANDOM_INIT: "the network the run started from (random weights), fine-tuned the same way",
    PROBE_PRETRAINED_LINEAR: "linear probe of the final/ weights, frozen",
    PROBE_RANDOM_INIT_LINEAR: "linear probe of the random initial weights, frozen",
    PROBE_TFIDF: "TF-IDF (words and word pairs) + logistic regression",
}
# Each network: its fine-tuned row and its linear-probe row.
NETWORKS = {PROBE_PRETRAINED: PROBE_PRETRAINED_LINEAR, PROBE_RANDOM_INIT: PROBE_RANDOM_INIT_LINEAR}


def parse_probe_args(argv: list[str] | None = None) -> ProbeCommand:
    return ProbeCommand(
        *parse_args(
            [ProbeArguments, CorpusArguments, ProbeTrainingArguments],
            argv,
            description=__doc__,
            prog="probe-classifier",
        )
    )


def results_path(run_dir: str | Path, label_level: str) -> Path:
    return Path(run_dir) / PROBE_DIR / f"{label_level}.json"


def resolve_max_length(requested: int | None, run: PretrainingRun) -> int:
    """Tokens per document: the run's block size (at most DEFAULT_MAX_LENGTH) unless asked;
    more than the block size is refused."""
    if requested is None:
        return min(run.block_size, DEFAULT_MAX_LENGTH)
    if requested > run.block_size:
        raise InputError(
            f"--max_length {requested} is above the run's pretraining block size "
            f"{run.block_size} (run_summary.json): positions past {run.block_size} were never "
            f"trained; pass --max_length {run.block_size} or less"
        )
    return requested


GAIN_LABELS = {"fine_tuned": "fine-tuned", "linear_probe": "linear probe"}


def pretraining_effect(methods: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """What pretraining bought, in accuracy points over the network it started from, by
    fine-tuning and by the linear probe, and one sentence that never calls pretraining harmful
    where the frozen features show it helped. None unless both networks were probed."""
    gains = {
        kind: round(100 * (methods[pretrained]["accuracy"] - methods[random]["accuracy"]), 1)
        for kind, (pretrained, random) in {
            "fine_tuned": (PROBE_PRETRAINED, PROBE_RANDOM_INIT),
            "linear_probe": (PROBE_PRETRAINED_LINEAR, PROBE_RANDOM_INIT_LINEAR),
        }.items()
        if pretrained in methods and random in methods
    }
    if not gains:
        return None
    parts = [f"{GAIN_LABELS[kind]} {gain:+.1f}" for kind, gain in gains.items()]
    fine_tuned, linear = gains.get("fine_tuned"), gains.get("linear_probe")
    features_gain = linear is not None and linear > 0
    fine_tuning_gain = fine_tuned is not None and fine_tuned > 0
    if features_gain and fine_tuned is not None and fine_tuned < 0:
        verdict = (
            "Pretraining helped the representation (the linear probe of the frozen features "
            "gains), but within this fine-tuning budget the random network learned the task "
            "from scratch and caught up with it; a longer budget or more pretraining tells them "
            "apart"
        )
    elif features_gain or (fine_tuning_gain and linear is None):
        verdict = "Pretraining helped"
    elif fine_tuning_gain:
        verdict = "Fine-tuning shows a gain, the frozen features do not show it yet"
    else:
        verdict = "Pretraining shows no gain on these labels yet"
    return {
        **{f"{kind}_points": gain for kind, gain in gains.items()},
        "verdict": f"{verdict} (accuracy of the pretrained network minus the random one, in "
        f"points: {', '.join(parts)}).",
    }


def run_probe(command: ProbeCommand) -> dict[str, Any]:
    """Check the inputs, split, probe and fine-tune every network, write and return the results."""
    started = time.perf_counter()
    probe, corpus_args, training_args = command
    config = command.to_dict()  # before the Trainer's scratch folder is filled in
    run = read_pretraining_run(probe.run_dir)
    max_length = resolve_max_length(probe.max_length, run)
    output_path = results_path(run.run_dir, probe.label_level)
    if output_path.exists() and not probe.overwrite:
        raise InputError(f"{output_path} already exists; pass --overwrite to replace it")
    pretrained_transformer = load_transformer(run.final_model_dir)
    tokenizer = load_tokenizer(run.final_model_dir)
    # Without a pad token (e.g. GPT-2's own tokenizer) pads are end-of-text; the attention
    # mask keeps them out of every pooling.
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    documents = load_probe_documents(corpus_args, probe.label_level, probe.label_names_file)

    overlap = find_pretraining_overlap(run.run_dir, documents.texts)
    is_test = split_documents(
        documents.texts,
        documents.labels,
        probe.test_fraction,
        probe.split_seed,
        forced_test=overlap.in_validation,
    )
    train_indices, test_indices = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    train_labels, test_labels = documents.labels[train_indices], documents.labels[test_indices]
    logger.info("%d training and %d test documents", len(train_indices), len(test_indices))
    encoded = encode_documents(documents.texts, tokenizer, max_length)
    task = ProbeTask(
        encoded=encoded,
        labels=documents.labels,
        train_indices=train_indices,
        test_indices=test_indices,
        num_classes=documents.num_classes,
        unseen=~overlap.in_training[test_indices] if overlap.status == REPRODUCED else None,
        pooling=probe.pooling,
        pad_token_id=tokenizer.pad_token_id,
        device=training_args.device,
    )

    methods: dict[str, dict[str, Any]] = {}
    linear_scores: dict[str, dict[str, Any]] = {}
    for network, linear_method in NETWORKS.items():
        if not ({network, linear_method} & set(probe.methods)) and not probe.curve:
            continue
        transformer = (
            pretrained_transformer if network == PROBE_PRETRAINED else initial_transformer(run)
        )
        linear_pipeline, linear_scores[network] = linear_probe(transformer, task)
        logger.info("%s: test accuracy %.4f", linear_method, linear_scores[network]["accuracy"])
        if linear_method in probe.methods:
            methods[linear_method] = linear_scores[network]
        if network in probe.methods:
            predictions, training = fine_tune_and_predict(
                PooledClassifier(transformer, probe.pooling, linear_pipeline, probe.head_init),
                tokenizer,
                classification_dataset(encoded, documents.labels, train_indices),
                classification_dataset(encoded, documents.labels, test_indices),
                training_args,
            )
            methods[network] = {**task.score(predictions), **training}
            logger.info("%s: test accuracy %.4f", network, methods[network]["accuracy"])
    if PROBE_TFIDF in probe.methods:
        predictions, seconds = tfidf_logistic_regression(
            [documents.texts[i] for i in train_indices],
            train_labels,
            [documents.texts[i] for i in test_indices],
        )
        methods[PROBE_TFIDF] = {**task.score(predictions), "train_seconds": seconds}
        logger.info("%s: test accuracy %.4f", PROBE_TFIDF, methods[PROBE_TFIDF]["accuracy"])
    methods = {
        method: {"description": METHOD_DESCRIPTIONS[method], **methods[method]}
        for method in PROBE_METHODS
        if method in methods
    }

    results = {
        "probe_version": PROBE_VERSION,
        "run_dir": str(run.run_dir.resolve()),
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
        "pretraining_effect": pretraining_effect(methods),
        "budget": {
            "max_length": max_length,
            "pretraining_block_size": run.block_size,
            "pooling": probe.pooling,
            "head_init": probe.head_init,
            "num_train_epochs": training_args.num_train_epochs,
            "learning_rate": training_args.learning_rate,
            "relative_learning_rate": training_args.relative_learning_rate,
            "train_tokens_per_epoch": int(sum(len(encoded[i]) for i in train_indices)),
            "test_tokens": int(sum(len(encoded[i]) for i in test_indices)),
        },
        "methods": methods,
        "curve": (
            probe_curve(
                run, task, linear_scores[PROBE_RANDOM_INIT], linear_scores[PROBE_PRETRAINED]
            )
            if probe.curve
            else None
        ),
        "wall_seconds": time.perf_counter() - started,
        "hardware": hardware_description(),
        "versions": library_versions(),
        "config": config,
    }
    write_json_atomic(output_path, results)
    return results


def format_results(results: dict[str, Any]) -> str:
    """The results as text: a line per method, the chance levels, the verdict, the probe curve."""
    lines = [
        f"{results['label_level']}: {len(results['class_names'])} classes, "
        f"{results['num_train']} training / {results['num_test']} test documents",
        f"{'method':<18} {'accuracy':>9} {'macro-F1':>9} {'seconds':>9}",
    ]
    for method, scores in results["methods"].items():
        lines.append(
            f"{method:<18} {scores['accuracy']:>9.4f} {scores['macro_f1']:>9.4f} "
            f"{scores['train_seconds']:>9.1f}"
        )
    chance = results["chance"]
    lines.append(
        f"chance: {chance['majority_class_accuracy']:.4f} (most frequent class), "
        f"{chance['uniform_accuracy']:.4f} (uniform)"
    )
    if results["pretraining_effect"]:
        lines.append(results["pretraining_effect"]["verdict"])
    if results["curve"]:
        points = ", ".join(
            f"{point['tokens']:,} tokens {point['accuracy']:.4f}"
            for point in results["curve"]["points"]
        )
        lines.append(f"probe curve (linear probe accuracy after): {points}")
    return "\n".join(lines)


@entry_point
def main(argv: list[str] | None = None) -> int:
    results = run_probe(parse_probe_args(argv))
    print(format_results(results))
    print(f"results: {results_path(results['run_dir'], results['label_level'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
