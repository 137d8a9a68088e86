"""The scaling ladder: the fit recovers a known law and predicts the rung left out, and four tiny
rungs train the course recipe at their shapes, each with the batch its tokens per parameter
give, on the same held-out blocks, tabulated, and read back when run again."""

import json
import math

import pytest

from bench import ladder
from common.run_contract import GPT_SUMMARY_FILE

E, A, ALPHA = 2.5, 300.0, 0.35
SIZES = [100_000, 300_000, 1_000_000, 3_000_000, 10_000_000]
COURSE_N = 85_056_000


def law(n: float) -> float:
    return E + A * n**-ALPHA


def test_the_fit_recovers_a_known_law_and_predicts_the_left_out_rung():
    # Two seeds a rung, 0.01 either side of the law: the least squares fit is the law's.
    points = [(n, law(n) + offset) for n in SIZES for offset in (0.01, -0.01)]
    fit = ladder.ladder_fit(points, COURSE_N)
    assert (fit.e, fit.a, fit.alpha) == pytest.approx((E, A, ALPHA), rel=1e-3)
    assert fit.largest == SIZES[-1]
    assert fit.left_out_measured == pytest.approx(law(SIZES[-1]))
    assert fit.left_out_predicted == pytest.approx(law(SIZES[-1]), abs=1e-3)
    assert fit.prediction == pytest.approx(law(COURSE_N), abs=1e-3)
    assert fit.half_width == pytest.approx(0.02, abs=1e-3)  # the seeds' spread: no error left


def test_the_interval_covers_the_leave_one_out_error_scaled_by_the_reach():
    # The largest rung 0.1 above the law: the others predict it 0.1 too low.
    points = [(n, law(n) + (0.1 if n == SIZES[-1] else 0.0)) for n in SIZES]
    fit = ladder.ladder_fit(points, COURSE_N)
    error = fit.left_out_predicted - fit.left_out_measured
    assert error == pytest.approx(-0.1, abs=1e-3)
    reach = math.log(COURSE_N / SIZES[-1]) / math.log(SIZES[-1] / SIZES[-2])
    assert fit.half_width == pytest.approx(abs(error) * reach) and fit.half_width > abs(error)


def test_the_fit_needs_four_rungs_and_says_so():
    with pytest.raises(ValueError, match="at least 4 rungs with a result, not 3"):
        ladder.ladder_fit([(n, law(n)) for n in SIZES[:3]], COURSE_N)


def test_the_fit_text_names_the_rung_left_out_and_the_prediction():
    rungs = [ladder.Rung(f"{i + 1}x64", n, 2 * n, 1, 3, 96) for i, n in enumerate(SIZES)]
    results = [[{"eval_loss": law(rung.non_embedding)}] for rung in rungs]
    text = ladder.fit_text(rungs, results, COURSE_N)
    assert f"5x64 ({SIZES[-1]:,}) predicted {law(SIZES[-1]):.3f}" in text
    assert f"N = {COURSE_N:,}): {law(COURSE_N):.3f} +- 0.000" in text


SHAPES = ["1x64", "2x64", "3x64", "4x64"]


@pytest.mark.slow
def test_four_tiny_rungs_train_with_the_batch_of_their_tokens_per_parameter(
    wos_corpus_dir, tiny_tokenizer_dir, tmp_path, capsys
):
    output_dir, per_parameter, steps, block_size = tmp_path / "ladder", 0.005, 3, 32
    argv = [
        "--tokenizer_dir", str(tiny_tokenizer_dir),
        "--output_dir", str(output_dir),
        "--shapes", *SHAPES,
        "--seeds", "0",
        "--tokens_per_parameter", str(per_parameter),
        "--steps", str(steps),
        "--block_size", str(block_size),
        "--num_parallel_runs", "2",
        "--",
        "--corpus", str(wos_corpus_dir),
        "--cache_dir", str(tmp_path / "cache"),
    ]  # fmt: skip
    assert ladder.main(argv) == 0
    table = capsys.readouterr().out
    assert table == (output_dir / "table.md").read_text()
    paths = sorted(output_dir.glob(f"runs/*/*/seed0/{GPT_SUMMARY_FILE}"))
    summaries = [json.loads(path.read_text()) for path in paths]
    by_shape = {s["config"]["ModelArguments"]["model_preset"]: s for s in summaries}
    assert sorted(by_shape) == SHAPES
    batches = []
    for shape, summary in by_shape.items():
        training, model = summary["config"]["TrainingArguments"], summary["config"]["model_config"]
        assert f"{model['n_layer']}x{model['n_embd']}" == shape
        assert summary["config"]["MuonArguments"]["muon"]  # the course recipe as shipped
        batch = max(1, round(per_parameter * summary["num_parameters"] / steps / block_size))
        assert training["per_device_train_batch_size"] == batch
        assert summary["max_steps"] == steps
        assert summary["tokens_trained"] == steps * batch * block_size
        embeddings = (model["vocab_size"] + model["n_positions"]) * model["n_embd"]
        total = summary["num_parameters"]
        row = f"| {shape} | {total - embeddings:,} | {total:,} | {steps * batch * block_size:,} |"
        assert f"{row} {batch} | {steps} |" in table
        assert f"| {summary['eval_loss']:.3f} | {summary['eval_loss']:.3f} |" in table
        batches.append(batch)
    assert batches == sorted(batches)  # a deeper rung has more parameters, so a larger batch
    validation = [s["data"]["splits"]["validation"] for s in summaries]
    assert all(split == validation[0] for split in validation)

    # Again: every run is read back, not trained.
    written = [path.stat().st_mtime_ns for path in paths]
    assert ladder.main(argv) == 0
    assert [path.stat().st_mtime_ns for path in paths] == written
    assert capsys.readouterr().out == table


def test_a_bad_shape_or_budget_is_one_error_line_before_any_run(
    wos_corpus_dir, tiny_tokenizer_dir, tmp_path, capsys
):
    argv = ["--tokenizer_dir", str(tiny_tokenizer_dir), "--output_dir", str(tmp_path / "ladder")]
    corpus = ["--", "--corpus", str(wos_corpus_dir)]
    assert ladder.main([*argv, "--shapes", "1x64", "2x64", "3x64", "2x100", *corpus]) == 2
    assert capsys.readouterr().err.startswith("error: model shape '2x100' needs at least 1 layer")
    assert ladder.main([*argv, "--shapes", "1x64", "2x64", "3x64", "3x64", *corpus]) == 2
    assert capsys.readouterr().err == (
        "error: --shapes 1x64 2x64 3x64 3x64: the fit needs at least 4 distinct shapes and a "
        "seed; give 4 or more shapes\n"
    )
    assert ladder.main([*argv, "--steps", "0", *corpus]) == 2
    assert capsys.readouterr().err == "error: --steps is 0; give at least 1\n"
    assert not (tmp_path / "ladder").exists()
