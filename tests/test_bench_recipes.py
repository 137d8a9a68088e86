"""The recipe benchmark: recipes read from their sources, passed to pretrain/run.py as they are,
judged on the same held-out blocks, finished runs read back rather than rerun."""

import json
import math
from pathlib import Path

import pytest
from transformers import TrainingArguments

from bench import recipes
from common.cli import parse_args


def test_config_recipes_are_read_from_the_shipped_configs():
    course = recipes.recipe_from_config("gpt2_117m.yaml")
    assert (course.learning_rate, course.schedule, course.warmup) == (1e-3, "constant", 0.05)
    tiny = recipes.recipe_from_config("tiny.yaml")
    assert (tiny.learning_rate, tiny.schedule, tiny.warmup) == (1e-3, "constant", 0.0)
    # TrainingArguments' defaults fill what a config leaves out: run_clm.py's recipe is them.
    run_clm = recipes.peer_recipes()["run_clm"]
    assert (run_clm.learning_rate, run_clm.schedule, run_clm.warmup) == (5e-5, "linear", 0.0)
    assert (run_clm.adam_beta2, run_clm.weight_decay) == (0.999, 0.0)


@pytest.mark.parametrize("name", ["tiny", "course", "nanogpt_small", "nanogpt_gpt2", "run_clm"])
def test_recipe_flags_set_exactly_the_recipe_in_training_arguments(name, tmp_path):
    recipe = recipes.named_recipes()[name]
    (parsed,) = parse_args([TrainingArguments], ["--output_dir", str(tmp_path), *recipe.flags(184)])
    assert (
        recipes.recipe_from_options(
            {key: getattr(parsed, key) for key in recipes.training_defaults()}
        )
        == recipe
    )


def test_a_warmup_stable_decay_recipe_cools_down_over_its_last_steps(tmp_path):
    recipe = recipes.resolve_recipe(
        "course:schedule=wsd,final_lr_fraction=0", recipes.named_recipes()
    )
    (parsed,) = parse_args([TrainingArguments], ["--output_dir", str(tmp_path), *recipe.flags(184)])
    assert parsed.lr_scheduler_type == "warmup_stable_decay"
    assert parsed.lr_scheduler_kwargs == {
        "num_decay_steps": 37,
        "min_lr_ratio": 0.0,
        "decay_type": "1-sqrt",
    }


def test_a_recipe_is_varied_in_place_and_bad_variations_are_refused():
    named = recipes.named_recipes()
    varied = recipes.resolve_recipe(
        "course:learning_rate=3.0e-3,schedule=cosine,final_lr_fraction=0", named
    )
    assert varied.learning_rate == 3e-3 and varied.final_lr_fraction == 0
    assert varied.schedule == "cosine" and varied.adam_beta2 == named["course"].adam_beta2
    # constant from a decaying recipe: the decay's end goes with it
    assert recipes.resolve_recipe("nanogpt_small:schedule=constant", named).final_lr_fraction == 1
    bad_specs = ["nanogpt", "course:lr=1", "course:adam_beta2=high", "course:schedule=step",
                 "course:final_lr_fraction=0"]  # fmt: skip
    for spec in bad_specs:
        with pytest.raises(recipes.InputError):
            recipes.resolve_recipe(spec, named)


def test_largest_loss_rise_is_the_climb_above_the_running_minimum():
    assert recipes.largest_loss_rise([8.0, 7.0, 7.5, 6.0, 6.2]) == pytest.approx(0.5)
    assert recipes.largest_loss_rise([9.0, 8.0, 7.0]) == 0.0


@pytest.mark.slow
def test_recipes_train_on_the_same_blocks_and_finished_runs_are_read_back(
    wos_corpus_dir, tiny_tokenizer_dir, tmp_path, capsys
):
    output_dir = tmp_path / "bench"
    argv = [
        "--corpus", str(wos_corpus_dir),
        "--tokenizer_dirs", str(tiny_tokenizer_dir),
        "--output_dir", str(output_dir),
        "--cache_dir", str(tmp_path / "cache"),
        "--recipes", "tiny", "run_clm:learning_rate=1.0e-3",
        "--seeds", "0",
        "--model_preset", "tiny",
        "--block_size", "32",
        "--batch_blocks", "4",
        "--num_steps", "4",
        "--logging_steps", "1",
        "--num_parallel_runs", "2",
    ]  # fmt: skip
    assert recipes.main(argv) == 0
    first_table = capsys.readouterr().out
    runs = sorted(
        json.loads((output_dir / "results.json").read_text())["runs"], key=lambda run: run["recipe"]
    )
    assert [run["recipe"] for run in runs] == ["run_clm:learning_rate=1.0e-3", "tiny"]
    for run in runs:
        assert not run["failed"] and run["tokens_trained"] == 4 * 4 * 32
        assert len(run["logged_training_losses"]) == 4
        assert run["bits_per_byte"] == pytest.approx(
            run["eval_loss"] * run["validation_tokens_per_byte"] / math.log(2)
        )
        summary = json.loads((Path(run["run_dir"]) / "run_summary.json").read_text())
        trained_with = summary["config"]["TrainingArguments"]
        assert trained_with["learning_rate"] == run["recipe_settings"]["learning_rate"]
    # The same held-out text for both recipes, and different recipes learn differently.
    assert runs[0]["validation_tokens_per_byte"] == runs[1]["validation_tokens_per_byte"]
    assert runs[0]["eval_loss"] != runs[1]["eval_loss"]
    tiny_loss = runs[1]["eval_loss"]
    assert f"| tiny | {tiny_loss:.3f} | {tiny_loss:.3f} | 0.000 |" in first_table

    summary_times = [(Path(run["run_dir"]) / "run_summary.json").stat().st_mtime_ns
                     for run in runs]  # fmt: skip
    assert recipes.main(argv) == 0
    assert capsys.readouterr().out == first_table
    assert summary_times == [
        (Path(run["run_dir"]) / "run_summary.json").stat().st_mtime_ns for run in runs
    ]


def test_an_unknown_recipe_is_one_error_line(capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One document.\n")
    argv = ["--corpus", str(corpus), "--tokenizer_dirs", str(tmp_path), "--recipes", "nanogpt"]
    assert recipes.main(argv) == 2
    assert capsys.readouterr().err.strip().startswith("error: unknown recipe 'nanogpt'")


def test_a_missing_corpus_is_one_error_line_before_any_run(capsys, tmp_path):
    argv = ["--corpus", str(tmp_path / "absent.txt"), "--tokenizer_dirs", str(tmp_path),
            "--output_dir", str(tmp_path / "bench")]  # fmt: skip
    assert recipes.main(argv) == 2
    assert "absent.txt" in capsys.readouterr().err and not (tmp_path / "bench").exists()
