"""probe/run.py on a tiny pretrained run and a labelled corpus of real English: the fine-tuned
model learns, the baselines run on the same split, the pretraining split is respected, and bad
input is one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from labelled_wos import python_reference_documents, write_labelled_wos
from pretrain_runs import shared_data_paths, tiny_run_argv

from common.run_contract import (
    PROBE_METHOD_REQUIRED_KEYS,
    PROBE_METHODS,
    PROBE_PRETRAINED,
    PROBE_RANDOM_INIT,
    PROBE_REQUIRED_KEYS,
    PROBE_TFIDF,
    PROBE_VERSION,
)
from probe.data import split_documents
from probe.overlap import UNKNOWN, find_pretraining_overlap
from probe.run import main, parse_probe_args, results_path

COURSE_CONFIG = Path(__file__).resolve().parents[1] / "probe" / "configs" / "gpt2_117m.yaml"
# The tiny model learns a 3-class task from ~190 short documents in a few seconds: several
# passes at a step size that suits 2 layers of width 64.
TINY_BUDGET = [
    "--max_length", "64",
    "--num_train_epochs", "6",
    "--learning_rate", "3.0e-3",
    "--per_device_train_batch_size", "16",
    "--logging_steps", "4",
    "--use_cpu", "true",
    "--disable_tqdm", "true",
]  # fmt: skip


@pytest.fixture(scope="module")
def labelled_corpus(tmp_path_factory) -> Path:
    """Paragraphs of the Python reference in 3 domains and 6 areas, with Data.xlsx; about 90
    of them are also in the pretraining corpus (the demo corpus's first 400 paragraphs)."""
    root = tmp_path_factory.mktemp("probe_corpus") / "WebOfScience"
    return write_labelled_wos(root, python_reference_documents())


@pytest.fixture(scope="module")
def pretrained_run(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory) -> Path:
    """A tiny pretraining run whose validation split (10%) holds some probe documents."""
    from pretrain.run import main as pretrain

    output_dir = tmp_path_factory.mktemp("probe_run") / "gpt_tiny"
    data_paths = shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)
    argv = tiny_run_argv(**data_paths, output_dir=output_dir, validation_fraction=0.1)
    assert pretrain(argv) == 0
    return output_dir


def probe_argv(run_dir: Path, corpus: Path, *flags: str) -> list[str]:
    return ["--run_dir", str(run_dir), "--corpus", str(corpus), *TINY_BUDGET, *flags]


@pytest.fixture(scope="module")
def domain_results(pretrained_run, labelled_corpus) -> dict:
    assert main(probe_argv(pretrained_run, labelled_corpus)) == 0
    return json.loads(results_path(pretrained_run, "domain").read_text())


def test_fine_tuned_model_beats_chance_beside_both_baselines(domain_results):
    results = domain_results
    assert results["probe_version"] == PROBE_VERSION
    assert set(results) >= set(PROBE_REQUIRED_KEYS)
    assert results["class_names"] == ["Expressions", "Program structure", "Text"]
    assert results["label_names_source"].endswith("Data.xlsx")
    assert list(results["methods"]) == list(PROBE_METHODS)
    chance = results["chance"]["majority_class_accuracy"]
    for method, scores in results["methods"].items():
        assert set(scores) >= set(PROBE_METHOD_REQUIRED_KEYS), method
        matrix = np.array(scores["confusion_matrix"])
        assert matrix.shape == (3, 3)
        assert matrix.sum() == results["num_test"]
        assert scores["accuracy"] == pytest.approx(np.trace(matrix) / matrix.sum())
        assert 0 <= scores["macro_f1"] <= 1
    pretrained = results["methods"][PROBE_PRETRAINED]
    assert pretrained["accuracy"] > chance + 0.1
    assert results["methods"][PROBE_TFIDF]["accuracy"] > chance
    for method in (PROBE_PRETRAINED, PROBE_RANDOM_INIT):
        losses = [entry["loss"] for entry in results["methods"][method]["train_losses"]]
        # Starts near ln(3) = 1.1 and must come down over the budget.
        assert losses[-1] < losses[0] - 0.2, method
        assert results["methods"][method]["num_steps"] == 6 * -(-results["num_train"] // 16)


def test_split_is_stratified_and_holds_pretraining_validation_in_test(
    domain_results, wos_corpus_dir
):
    results = domain_results
    overlap = results["pretraining_overlap"]
    assert overlap["status"] == "reproduced"
    assert overlap["num_pretraining_validation_documents"] > 0
    assert (
        overlap["num_pretraining_validation_in_test"]
        == (overlap["num_pretraining_validation_documents"])
    )
    pretraining_texts = (wos_corpus_dir / "WOS46985" / "X.txt").read_text().splitlines()
    probe_texts = [text for text, _, _ in python_reference_documents()]
    assert (
        overlap["num_pretraining_validation_documents"]
        + overlap["num_pretraining_training_documents_in_train"]
        + overlap["num_pretraining_training_documents_in_test"]
    ) == len(set(pretraining_texts) & set(probe_texts))
    unseen = overlap["num_test_unseen_by_pretraining"]
    assert unseen == results["num_test"] - overlap["num_pretraining_training_documents_in_test"]
    for scores in results["methods"].values():
        assert scores["num_unseen_by_pretraining"] == unseen
    counts = results["class_counts"]
    assert sum(counts["train"]) + sum(counts["test"]) == results["num_documents"] == 237
    for train, test in zip(counts["train"], counts["test"], strict=True):
        assert train > 0 and test > 0
        assert test / (train + test) == pytest.approx(0.2, abs=0.05)


def test_split_rule_depends_on_text_class_and_seed_only():
    texts = [f"document number {i}" for i in range(40)]
    labels = np.array([0] * 30 + [1] * 9 + [2])
    forced = np.zeros(40, bool)
    forced[[0, 1, 2, 3, 4, 5, 6, 7]] = True  # more than class 0's quota of 6
    is_test = split_documents(texts, labels, 0.2, seed=0, forced_test=forced)
    assert is_test[forced].all()
    assert is_test[labels == 0].sum() == 8
    assert is_test[labels == 1].sum() == 2  # round(0.2 x 9)
    assert not is_test[39]  # a class of one document can only be trained on
    order = np.random.default_rng(0).permutation(40)
    shuffled = split_documents(
        [texts[i] for i in order], labels[order], 0.2, seed=0, forced_test=forced[order]
    )
    assert (shuffled == is_test[order]).all()
    other_seed = split_documents(texts, labels, 0.2, seed=1, forced_test=forced)
    assert (other_seed != is_test).any()


def test_area_and_combined_levels_are_the_same_areas(pretrained_run, labelled_corpus):
    results = {}
    for level in ("area", "combined"):
        argv = probe_argv(pretrained_run, labelled_corpus, "--label_level", level)
        assert main([*argv, "--methods", PROBE_TFIDF]) == 0
        results[level] = json.loads(results_path(pretrained_run, level).read_text())
    assert results["area"]["class_names"] == results["combined"]["class_names"] == [
        "arithmetic", "comparisons", "exceptions", "modules", "format strings", "strings",
    ]  # fmt: skip
    area, combined = (results[level]["methods"][PROBE_TFIDF] for level in results)
    assert area["confusion_matrix"] == combined["confusion_matrix"]


def test_overlap_is_unknown_without_a_recorded_split(tmp_path):
    overlap = find_pretraining_overlap(tmp_path, ["a text"])
    assert overlap.status == UNKNOWN and "document_split.json is missing" in overlap.reason
    assert not overlap.in_validation.any() and not overlap.in_training.any()


def labelled_copy(labelled_corpus: Path, folder: Path, **replace: str) -> Path:
    root = folder / "WebOfScience"
    shutil.copytree(labelled_corpus, root)
    for name, text in replace.items():
        (root / "WOS46985" / f"{name}.txt").write_text(text)
    return root


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        ({"YL1": "0\n1\n"}, "YL1.txt beside .* has 2 labels but the texts have 237 lines"),
        ({"YL1": "0\n" * 200 + "Text\n" * 37}, "YL1.txt line 201: 'Text' is not an integer"),
        ({"YL1": "4\n" * 237}, "the domain labels .* hold one class .* two or more"),
    ],
)
def test_bad_labels_are_one_line_and_write_nothing(
    pretrained_run, labelled_corpus, tmp_path, capsys, replace, message
):
    corpus = labelled_copy(labelled_corpus, tmp_path, **replace)
    probe_dir = results_path(pretrained_run, "domain").parent
    before = sorted(probe_dir.iterdir()) if probe_dir.exists() else []
    assert main(probe_argv(pretrained_run, corpus, "--overwrite", "true")) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ")
    assert re.search(message, error), error
    assert (sorted(probe_dir.iterdir()) if probe_dir.exists() else []) == before


def test_run_folder_without_final_model_is_one_line(labelled_corpus, tmp_path, capsys):
    run_dir = tmp_path / "unfinished"
    run_dir.mkdir()
    assert main(probe_argv(run_dir, labelled_corpus)) == 2
    assert "has no final/ model" in capsys.readouterr().err
    assert list(run_dir.iterdir()) == []


def test_weights_under_other_names_are_refused_not_replaced_by_random_ones(
    pretrained_run, tmp_path
):
    from safetensors.torch import load_file, save_file

    from common.cli import InputError
    from probe.classifier import build_classifier

    final = tmp_path / "final"
    shutil.copytree(pretrained_run / "final", final)
    weights = load_file(final / "model.safetensors")
    renamed = {name.replace(".h.", ".blocks."): tensor for name, tensor in weights.items()}
    save_file(renamed, final / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"lacks \d+ of the transformer's weights"):
        build_classifier(final, ["a", "b"], pad_token_id=1, pretrained=True, seed=0)
    model = build_classifier(pretrained_run / "final", ["a", "b"], 1, pretrained=True, seed=0)
    assert model.config.num_labels == 2 and model.config.pad_token_id == 1


def test_existing_results_are_not_overwritten(
    domain_results, pretrained_run, labelled_corpus, capsys
):
    assert main(probe_argv(pretrained_run, labelled_corpus)) == 2
    assert "domain.json already exists; pass --overwrite" in capsys.readouterr().err


def test_course_config_is_the_documented_budget():
    command = parse_probe_args(["--config", str(COURSE_CONFIG)])
    assert command.probe.run_dir == "runs/gpt2_117m"
    assert command.corpus.corpus == ["data/WebOfScience.zip"]
    assert (command.probe.label_level, command.probe.max_length) == ("domain", 256)
    training = command.training
    assert (training.num_train_epochs, training.learning_rate) == (1.0, 1e-4)
    gpu_has_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    assert training.bf16 is gpu_has_bf16
    on_cpu = parse_probe_args(["--config", str(COURSE_CONFIG), "--use_cpu", "true"])
    assert on_cpu.training.bf16 is False
    assert training.save_strategy == "no" and not training.keeps_trainer_files
