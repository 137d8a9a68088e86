"""probe/run.py on tiny pretrained runs and labelled corpora of real English: the classifiers
learn on the same split, the pretraining split is respected, bad input is one line; and on
docstrings of four fields with a run pretrained well below its unigram entropy, pretraining
shows by fine-tuning and by the linear probe, over a curve of its checkpoints, in the report."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from labelled_wos import python_reference_documents, write_labelled_wos
from pretrain_runs import TINY_CONFIG, shared_data_paths, tiny_run_argv

from common.run_contract import (
    CHECKPOINT_MANIFEST_FILE,
    GPT_SUMMARY_FILE,
    PROBE_CURVE_POINT_KEYS,
    PROBE_METHOD_REQUIRED_KEYS,
    PROBE_METHODS,
    PROBE_PRETRAINED,
    PROBE_PRETRAINED_LINEAR,
    PROBE_RANDOM_INIT,
    PROBE_RANDOM_INIT_LINEAR,
    PROBE_REQUIRED_KEYS,
    PROBE_TFIDF,
    PROBE_VERSION,
)
from probe.data import split_documents
from probe.features import END_OF_TEXT, LAST_TOKEN, MEAN, pool_hidden_states
from probe.overlap import UNKNOWN, find_pretraining_overlap
from probe.pretraining_run import (
    PretrainingRun,
    initial_transformer,
    load_transformer,
    read_pretraining_run,
)
from probe.run import (
    main,
    parse_probe_args,
    pretraining_effect,
    resolve_max_length,
    results_path,
)

COURSE_CONFIG = Path(__file__).resolve().parents[1] / "probe" / "configs" / "gpt2_117m.yaml"
# The default budget (3 epochs) in smaller batches: ~190 short documents, 12 steps an epoch.
TINY_BUDGET = [
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
    """A tiny pretraining run whose validation split (10%) holds some probe documents: 96
    steps, since after 24 the fine-tuned accuracy swung from 0.38 to 0.64 with the probe's
    batch order (seed), and after 96 it stayed within 0.74-0.79 over five seeds."""
    from pretrain.run import main as pretrain

    output_dir = tmp_path_factory.mktemp("probe_run") / "gpt_tiny"
    data_paths = shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)
    argv = tiny_run_argv(
        **data_paths, output_dir=output_dir, num_blocks=384, validation_fraction=0.1
    )
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
        # Fine-tuning starts from the linear probe's head and must still improve on it.
        assert losses[-1] < losses[0], method
        assert results["methods"][method]["num_steps"] == 3 * -(-results["num_train"] // 16)
    assert results["budget"]["max_length"] == 64  # the run's block size
    assert results["pretraining_effect"]["verdict"]


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
        assert main([*argv, "--methods", PROBE_TFIDF, "--curve", "false"]) == 0
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


def test_summary_with_a_bare_nan_is_one_line(pretrained_run, labelled_corpus, tmp_path, capsys):
    # As Python's default json.dumps writes a NaN loss: not JSON, and read leniently it would
    # be a number.
    run_dir = tmp_path / "nan_summary"
    # Without the results of the probes that earlier tests ran on the shared run.
    shutil.copytree(pretrained_run, run_dir, ignore=shutil.ignore_patterns("probe"))
    summary = json.loads((run_dir / GPT_SUMMARY_FILE).read_text())
    (run_dir / GPT_SUMMARY_FILE).write_text(json.dumps({**summary, "final_loss": float("nan")}))
    assert main(probe_argv(run_dir, labelled_corpus)) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: {run_dir / GPT_SUMMARY_FILE} is not valid JSON"), error
    assert "NaN" in error
    assert not (run_dir / "probe").exists()


def test_weights_under_other_names_are_refused_not_replaced_by_random_ones(
    pretrained_run, tmp_path
):
    from safetensors.torch import load_file, save_file

    from common.cli import InputError

    final = tmp_path / "final"
    shutil.copytree(pretrained_run / "final", final)
    weights = load_file(final / "model.safetensors")
    renamed = {name.replace(".h.", ".blocks."): tensor for name, tensor in weights.items()}
    save_file(renamed, final / "model.safetensors", metadata={"format": "pt"})
    # Sealed by its manifest, the folder is damaged; a model saved elsewhere has none.
    with pytest.raises(InputError, match=r"is damaged: model.safetensors has [\d,]+ bytes"):
        load_transformer(final)
    (final / CHECKPOINT_MANIFEST_FILE).unlink()
    with pytest.raises(InputError, match=r"lacks \d+ of the transformer's weights"):
        load_transformer(final)
    assert load_transformer(pretrained_run / "final").config.n_layer == 2


def test_a_truncated_checkpoint_is_one_line_not_a_safetensors_traceback(pretrained_run, tmp_path):
    from common.cli import InputError

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(pretrained_run / "final", checkpoint)
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(InputError, match="is damaged: model.safetensors has 1,000 bytes"):
        load_transformer(checkpoint)
    (checkpoint / CHECKPOINT_MANIFEST_FILE).unlink()  # as plain transformers saves one
    with pytest.raises(InputError, match="holds no loadable GPT-2 weights"):
        load_transformer(checkpoint)


def test_max_length_above_the_pretraining_block_size_is_one_line(
    pretrained_run, labelled_corpus, capsys
):
    assert main(probe_argv(pretrained_run, labelled_corpus, "--max_length", "65")) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: --max_length 65 is above the run's pretraining block size 64")


def test_max_length_defaults_to_the_block_size_up_to_256():
    def run(block_size: int) -> PretrainingRun:
        return PretrainingRun(Path("run"), block_size, 0, block_size * 16, 10)

    assert resolve_max_length(None, run(64)) == 64
    assert resolve_max_length(None, run(1024)) == 256
    assert resolve_max_length(512, run(1024)) == 512


def test_verdict_never_says_pretraining_hurt_when_its_features_are_better():
    def effect(fine_tuned: tuple[float, float], linear: tuple[float, float]) -> dict:
        methods = {
            PROBE_PRETRAINED: fine_tuned[0],
            PROBE_RANDOM_INIT: fine_tuned[1],
            PROBE_PRETRAINED_LINEAR: linear[0],
            PROBE_RANDOM_INIT_LINEAR: linear[1],
        }
        return pretraining_effect({name: {"accuracy": a} for name, a in methods.items()})

    caught_up = effect(fine_tuned=(0.66, 0.79), linear=(0.79, 0.67))
    assert (caught_up["fine_tuned_points"], caught_up["linear_probe_points"]) == (-13.0, 12.0)
    assert caught_up["verdict"].startswith("Pretraining helped the representation")
    assert "random network learned the task from scratch" in caught_up["verdict"]
    assert effect((0.9, 0.8), (0.7, 0.6))["verdict"].startswith("Pretraining helped (")
    assert effect((0.7, 0.8), (0.5, 0.6))["verdict"].startswith("Pretraining shows no gain")
    assert pretraining_effect({PROBE_TFIDF: {"accuracy": 0.9}}) is None


def test_random_network_is_the_one_pretraining_started_from(pretrained_run):
    from transformers import GPT2Config, set_seed

    from pretrain.model import build_model

    summary = json.loads((pretrained_run / GPT_SUMMARY_FILE).read_text())
    set_seed(summary["config"]["TrainingArguments"]["seed"])
    started_from = build_model(GPT2Config(**summary["config"]["model_config"])).transformer
    rebuilt = initial_transformer(read_pretraining_run(pretrained_run))
    for name, tensor in started_from.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name], tensor), name


def test_pooling_reads_the_text_tokens_never_the_padding():
    # Two documents, the second padded: [a, b, eot] and [c, eot, pad]; width 1.
    hidden = torch.tensor([[[1.0], [3.0], [10.0]], [[5.0], [20.0], [99.0]]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert pool_hidden_states(hidden, mask, MEAN).flatten().tolist() == [2.0, 5.0]
    assert pool_hidden_states(hidden, mask, LAST_TOKEN).flatten().tolist() == [3.0, 5.0]
    assert pool_hidden_states(hidden, mask, END_OF_TEXT).flatten().tolist() == [10.0, 20.0]


def test_existing_results_are_not_overwritten(
    domain_results, pretrained_run, labelled_corpus, capsys
):
    assert main(probe_argv(pretrained_run, labelled_corpus)) == 2
    assert "domain.json already exists; pass --overwrite" in capsys.readouterr().err


def test_course_config_is_the_documented_budget():
    """The probe's course config probes the pretraining course run, on its corpus."""
    command = parse_probe_args(["--config", str(COURSE_CONFIG)])
    course_run = yaml.safe_load(TINY_CONFIG.with_name("gpt2_117m.yaml").read_text())
    assert command.probe.run_dir == course_run["output_dir"]
    assert command.corpus.corpus == course_run["corpus"]
    training = command.training
    gpu_has_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    assert training.bf16 is gpu_has_bf16
    on_cpu = parse_probe_args(["--config", str(COURSE_CONFIG), "--use_cpu", "true"])
    assert on_cpu.training.bf16 is False
    assert training.save_strategy == "no" and not training.keeps_trainer_files


# ---------------------------------------------------------------- pretraining shows


@pytest.fixture(scope="module")
def docstring_corpus(tmp_path_factory) -> Path:
    """Docstrings of installed packages in 4 fields (8 areas), 400 per area where there are as
    many: 2,803 documents in the WoS layout, the pretraining corpus and the probe's."""
    from labelled_wos import package_docstring_documents

    root = tmp_path_factory.mktemp("docstrings") / "WebOfScience"
    return write_labelled_wos(root, package_docstring_documents(documents_per_area=400))


@pytest.fixture(scope="module")
def docstring_run(docstring_corpus, tmp_path_factory) -> Path:
    """The tiny preset pretrained on the corpus for 800 steps of 16 x 64 tokens (one pass),
    checkpoints every 200 steps of which rotation keeps 3 (400, 600, 800); plus an
    unloadable checkpoint-50/ (a config, no weights), as a job killed mid-save leaves it."""
    from pretrain.run import main as pretrain
    from tokenizer.train import main as train_tokenizer

    root = tmp_path_factory.mktemp("docstring_run")
    tokenizer_dir = root / "tokenizer"
    corpus = ["--corpus", str(docstring_corpus)]
    assert (
        train_tokenizer([*corpus, "--output_dir", str(tokenizer_dir), "--vocab_size", "1024"]) == 0
    )
    run_dir = root / "gpt_tiny"
    argv = [
        "--config", str(TINY_CONFIG), *corpus,
        "--tokenizer_dir", str(tokenizer_dir),
        "--cache_dir", str(root / "cache"),
        "--output_dir", str(run_dir),
        "--max_train_tokens", str(800 * 16 * 64),
        "--save_steps", "200",
        "--save_total_limit", "3",
        "--disable_tqdm", "true",
    ]  # fmt: skip
    assert pretrain(argv) == 0
    (run_dir / "checkpoint-50").mkdir()
    shutil.copy(run_dir / "final" / "config.json", run_dir / "checkpoint-50")
    return run_dir


@pytest.fixture(scope="module")
def docstring_results(docstring_run, docstring_corpus) -> dict:
    """Every classifier and the probe curve; the default budget but one epoch, which keeps
    the test short (docs/PROBE.md has 3 epochs too: pretrained ahead by 3 to 5 points)."""
    argv = ["--run_dir", str(docstring_run), "--corpus", str(docstring_corpus)]
    argv += ["--num_train_epochs", "1", "--use_cpu", "true", "--disable_tqdm", "true"]
    assert main(argv) == 0
    return json.loads(results_path(docstring_run, "domain").read_text())


@pytest.mark.slow
def test_run_is_pretrained_well_below_its_unigram_entropy(docstring_run):
    summary = json.loads((docstring_run / GPT_SUMMARY_FILE).read_text())
    assert summary["final_loss"] < summary["data"]["unigram_entropy_nats"] - 1.0


@pytest.mark.slow
def test_pretraining_shows_by_fine_tuning_and_by_the_linear_probe(docstring_results):
    methods = {name: scores["accuracy"] for name, scores in docstring_results["methods"].items()}
    assert list(methods) == list(PROBE_METHODS)
    assert methods[PROBE_PRETRAINED] >= methods[PROBE_RANDOM_INIT]
    assert methods[PROBE_PRETRAINED_LINEAR] > methods[PROBE_RANDOM_INIT_LINEAR]
    # Fine-tuning starts from the linear probe and improves on it.
    assert methods[PROBE_PRETRAINED] > methods[PROBE_PRETRAINED_LINEAR]
    # Real topics that share their words: not separable by a keyword.
    assert docstring_results["chance"]["majority_class_accuracy"] < 0.3
    assert methods[PROBE_TFIDF] < 1.0
    assert docstring_results["pretraining_effect"]["verdict"].startswith("Pretraining helped")
    assert docstring_results["budget"]["max_length"] == 64


@pytest.mark.slow
def test_probe_curve_covers_step_0_every_loadable_checkpoint_and_the_end(
    docstring_results, docstring_run
):
    curve = docstring_results["curve"]
    methods = docstring_results["methods"]
    points = curve["points"]
    assert all(set(point) >= set(PROBE_CURVE_POINT_KEYS) for point in points)
    # checkpoint-800 holds the final/ weights: one point, the final model's.
    assert [point["step"] for point in points] == [0, 400, 600, 800]
    assert [point["tokens"] for point in points] == [step * 1024 for step in (0, 400, 600, 800)]
    assert [point["model"] for point in points][1:] == ["checkpoint-400", "checkpoint-600", "final"]
    assert points[0]["accuracy"] == methods[PROBE_RANDOM_INIT_LINEAR]["accuracy"]
    assert points[-1]["accuracy"] == methods[PROBE_PRETRAINED_LINEAR]["accuracy"]
    assert curve["num_checkpoints_found"] == 4
    (skipped,) = curve["skipped_checkpoints"]
    assert skipped["checkpoint"] == "checkpoint-50"


@pytest.mark.slow
def test_report_shows_the_probe_curve_next_to_the_loss_curve(
    docstring_results, docstring_run, tmp_path
):
    from report import build, sections

    markdown = build.write_report([docstring_run], tmp_path / "report").read_text()
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert figures[figures.index("gpt_loss.png") + 1] == sections.PROBE_CURVE_FIGURE
    assert (tmp_path / "report" / sections.PROBE_CURVE_FIGURE).stat().st_size > 10_000
    for method in PROBE_METHODS:
        assert f"| `{method}` |" in markdown
    assert docstring_results["pretraining_effect"]["verdict"] in markdown
