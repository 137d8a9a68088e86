"""The recipe benchmark: each recipe file trains with exactly its settings on top of the course
config, the tiny and run_clm recipes are what their sources train with, every row trains on the
same blocks and is tabulated, finished runs are read back, bad rows are one line."""

import dataclasses
import json
import shutil

import pytest
import yaml

from bench import compare_recipes
from bench.compare_recipes import BASE_CONFIG, PROXY_FLAGS, RECIPE_DIR, recipe_flags
from common.run_contract import GPT_SUMMARY_FILE
from pretrain.run import parse_pretrain_args

RECIPES = sorted(path.stem for path in RECIPE_DIR.glob("*.yaml"))
OPTIMISER_KEYS = ("learning_rate", "warmup_steps", "lr_scheduler_type", "lr_scheduler_kwargs",
                  "optim", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay",
                  "max_grad_norm")  # fmt: skip


def resolved_optimiser(*argv: str) -> dict:
    args = parse_pretrain_args(list(argv))
    training = args.training.to_dict()
    training["lr_scheduler_kwargs"] = training["lr_scheduler_kwargs"] or {}  # None: none
    muon = dataclasses.asdict(args.optimizer) if args.optimizer.muon else {"muon": False}
    return {key: training[key] for key in OPTIMISER_KEYS} | muon  # Muon's keys if it trains


def recipe_run(name: str) -> dict:
    return resolved_optimiser("--config", str(BASE_CONFIG), *PROXY_FLAGS, *recipe_flags(name))


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_file_trains_with_exactly_its_settings(name):
    written = yaml.safe_load((RECIPE_DIR / f"{name}.yaml").read_text()) or {}
    resolved = recipe_run(name)
    for key, value in written.items():
        assert resolved[key] == value, key
    course = resolved_optimiser("--config", str(BASE_CONFIG))
    assert {key: course[key] for key in resolved if key not in written} == {
        key: value for key, value in resolved.items() if key not in written
    }


MUON_KEYS = ("muon_learning_rate", "muon_momentum", "muon_weight_decay", "embedding_learning_rate")


@pytest.mark.parametrize("name", sorted(set(RECIPES) - {"course"}))  # course: the config itself
def test_a_whole_recipe_states_every_setting_so_none_comes_from_the_course_config(name):
    # A setting left out is the course config's: when the config changed, nanochat's transplant
    # trained its tied embedding at the course's Muon-era rate, 4.6x its own, unseen.
    written = yaml.safe_load((RECIPE_DIR / f"{name}.yaml").read_text())
    expected = set(OPTIMISER_KEYS) - {"optim"}  # fused or not, the same AdamW
    if written["muon"]:
        expected |= set(MUON_KEYS)
    assert sorted(expected - set(written)) == []


def test_the_tiny_recipe_is_what_tiny_yaml_trains_with():
    tiny_config = BASE_CONFIG.with_name("tiny.yaml")
    assert recipe_run("tiny") == resolved_optimiser("--config", str(tiny_config))


def test_the_run_clm_recipe_is_training_arguments_defaults():
    no_config = ["--corpus", "unused", "--tokenizer_dir", "unused"]
    assert recipe_run("run_clm") == resolved_optimiser(*no_config)


def test_settings_cells_say_each_schedule():
    def cells(name: str, *flags: str) -> list[str]:
        args = parse_pretrain_args(
            ["--config", str(BASE_CONFIG), *PROXY_FLAGS, *recipe_flags(name), *flags]
        )
        return compare_recipes.settings_cells(args.to_dict())

    expected = ["1.5e-3", "5%", "cosine to 10%", "0.95", "0.1", "1", "AdamW"]
    assert cells("course_before") == expected
    assert cells("tiny", "--warmup_steps", "0.05")[1:3] == ["0%", "constant"]  # ignored
    assert cells("muon_constant")[1:3] == ["5%", "constant"]
    assert cells("course")[2] == "constant, then linear to 5% over the last 65% of the steps"
    assert cells("wsd")[2] == "constant, then 1-sqrt to 0% over the last 37 steps"
    assert cells("run_clm")[2] == "linear to 0%"
    muon = ["--muon", "true", "--muon_learning_rate", "0.01", "--embedding_learning_rate", "3e-3"]
    assert cells("muon_constant", *muon)[-1] == (
        "Muon 1.0e-2, momentum 0.95, decay 0; embeddings 3.0e-3"
    )


def test_largest_loss_rise_is_the_climb_above_the_running_minimum():
    assert compare_recipes.largest_loss_rise([8.0, 7.0, 7.5, 6.0, 6.2]) == pytest.approx(0.5)
    assert compare_recipes.largest_loss_rise([9.0, 8.0, 7.0]) == 0.0


@pytest.mark.slow
def test_rows_train_on_the_same_blocks_are_tabulated_and_read_back(
    wos_corpus_dir, tiny_tokenizer_dir, tmp_path, capsys
):
    output_dir = tmp_path / "bench"
    argv = [
        "--tokenizer_dirs", str(tiny_tokenizer_dir),
        "--output_dir", str(output_dir),
        "--recipes", "tiny", "run_clm --learning_rate 1.0e-3",
        "--seeds", "0",
        "--num_parallel_runs", "2",
        "--",
        "--corpus", str(wos_corpus_dir),
        "--cache_dir", str(tmp_path / "cache"),
        "--model_preset", "tiny",
        "--block_size", "32",
        "--per_device_train_batch_size", "4",
        "--max_train_tokens", str(4 * 4 * 32),
        "--logging_steps", "1",
    ]  # fmt: skip
    assert compare_recipes.main(argv) == 0
    table = capsys.readouterr().out
    runs = output_dir / "runs" / tiny_tokenizer_dir.name
    summaries = {
        row: json.loads((runs / row / "seed0" / GPT_SUMMARY_FILE).read_text())
        for row in ("tiny", "run_clm-learning_rate-1.0e-3")
    }
    tiny, run_clm = summaries["tiny"], summaries["run_clm-learning_rate-1.0e-3"]
    for summary in summaries.values():
        assert summary["tokens_trained"] == 4 * 4 * 32
        assert summary["config"]["ModelArguments"]["model_preset"] == "tiny"
    # The row's flag overrides its recipe, which overrides the course config.
    assert run_clm["config"]["TrainingArguments"]["learning_rate"] == 1e-3
    assert run_clm["config"]["TrainingArguments"]["adam_beta2"] == 0.999
    # The same held-out blocks for both rows, and different recipes learn differently.
    assert tiny["data"]["splits"]["validation"] == run_clm["data"]["splits"]["validation"]
    assert tiny["eval_loss"] != run_clm["eval_loss"]
    loss = f"{tiny['eval_loss']:.3f}"
    assert f"| tiny | {loss} | {loss} | 0.000 | {tiny['bits_per_byte']:.3f} |" in table
    assert table == (output_dir / "table.md").read_text()

    # Again: read back, not trained; a second tokenizer compares vocabularies.
    written = (runs / "tiny" / "seed0" / GPT_SUMMARY_FILE).stat().st_mtime_ns
    other_tokenizer = shutil.copytree(tiny_tokenizer_dir, tmp_path / "tokenizer-copy")
    argv[1:2] = [str(tiny_tokenizer_dir), str(other_tokenizer)]
    argv[argv.index("--recipes") + 1 : argv.index("--seeds")] = ["tiny"]
    assert compare_recipes.main(argv) == 0
    header, _, first, second = capsys.readouterr().out.splitlines()
    assert (runs / "tiny" / "seed0" / GPT_SUMMARY_FILE).stat().st_mtime_ns == written
    columns = [cell.strip() for cell in header.split("|")]
    cells = [cell.strip() for cell in first.split("|")]
    assert cells[columns.index("validation loss per seed")] == loss
    assert cells[columns.index("vocabulary")] == f"{tiny['config']['model_config']['vocab_size']:,}"
    assert cells[columns.index("FLOPs/token")] == f"{tiny['flops_per_token'] / 1e6:.1f}M"
    # Same tokenizer, same blocks: the copy's run ends exactly where the first one did.
    assert second.split("|")[4] == first.split("|")[4]


def test_an_unknown_recipe_or_flag_is_one_error_line_before_any_run(
    wos_corpus_dir, tiny_tokenizer_dir, capsys, tmp_path
):
    argv = ["--tokenizer_dirs", str(tiny_tokenizer_dir), "--output_dir", str(tmp_path / "b")]
    corpus = ["--", "--corpus", str(wos_corpus_dir)]
    assert compare_recipes.main([*argv, "--recipes", "nanogpt", *corpus]) == 2
    assert capsys.readouterr().err.strip().startswith("error: unknown recipe 'nanogpt'")
    assert compare_recipes.main([*argv, "--recipes", "course --learning_rte 1", *corpus]) == 2
    assert "--learning_rte (did you mean --learning_rate?)" in capsys.readouterr().err
    assert compare_recipes.main([*argv, "--", "--corpus", str(tmp_path / "absent.txt")]) == 2
    assert "absent.txt" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_a_row_whose_runs_all_failed_keeps_its_tokenizer_in_the_vocabulary_column():
    runs = [compare_recipes.Run("tiny", f"runs/{name}", None, []) for name in ("bpe8k", "bpe16k")]
    lines = compare_recipes.format_table(runs, [None, None], vocabularies=True).splitlines()
    header, rows = lines[0].split(" | "), [line.split(" | ") for line in lines[2:]]
    for row, name in zip(rows, ("bpe8k", "bpe16k"), strict=True):
        assert len(row) == len(header) and row[1] == name and row[2] == "-"
        assert row[header.index("validation loss per seed")] == "failed"
