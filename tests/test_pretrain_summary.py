"""run_summary.json: every key from the two plain records, and the judgements derived from them."""

import dataclasses
import json
import math
import time

import pytest

from common.files import write_json_atomic
from common.run_contract import GPT_REQUIRED_KEYS, GPT_SUMMARY_VERSION, GPT_TIME_BUDGET_PARTS
from pretrain.args import PrecisionChoice
from pretrain.batches import BlockSchedule
from pretrain.metrics import TimeBudget
from pretrain.parallel.strategy import Strategy
from pretrain.plan import RunPlan, RunSetup
from pretrain.summary import LoopResult, final_training_loss, headline, run_summary

VALIDATION = {"num_evaluated_tokens": 250, "num_evaluated_bytes": 1000}
PLAN = RunPlan(
    tokenizer=None,  # the summary reads none of the plan's inputs
    model_config=None,
    blocks=None,
    precision=PrecisionChoice("no", "automatic (cpu: fp32)", tf32=False),
    final_loss_window=3,
    loss_threshold=7.0,
    # 40 blocks of 64 tokens, 4 per step: 10 steps of 256 tokens.
    schedule=BlockSchedule(num_train_blocks=40, batch_blocks=4, block_size=64, max_steps=10),
    data={"cache_dir": "c", "splits": {"validation": VALIDATION}},
)
SETUP = RunSetup(
    config={"ModelArguments": {"model_preset": "tiny"}},
    num_parameters=1000,
    flops_per_token=6000.0,
    peak_flops_per_second=1e9,
    speed_settings={"batch": 4},
)
RANKS = [
    {"rank": 0, "peak_memory_bytes": 2**30, "peak_memory_source": "process_max_rss"},
    {"rank": 1, "peak_memory_bytes": 2**31, "peak_memory_source": "process_max_rss"},
]


def result(**changes) -> LoopResult:
    values = {
        "start_step": 4,
        "global_step": 10,
        "logged_losses": [9.0, 6.0, 5.0, 4.0],
        "eval_loss": 5.5,
        "loop_seconds": 2.0,
        "first_step_seconds": 0.5,
        "ranks": RANKS,
        "replica_checksums": ["a", "a"],
        "budget": TimeBudget(launched_at=time.time()),
        "strategy": Strategy("fsdp2", "FSDP", 2),
        "accelerator_state": "Device: cpu",
        **changes,
    }
    return LoopResult(**values)


def test_summary_holds_every_key_and_derives_speed_and_verdicts(tmp_path):
    budget = TimeBudget(launched_at=time.time() - 3.0)
    time.sleep(0.05)
    budget.lap("data")
    time.sleep(0.2)
    budget.lap("loop")
    saves = [{"step": 5, "seconds": 0.02}, {"step": 10, "seconds": 0.03}]
    summary = run_summary(
        PLAN, SETUP, result(budget=budget, checkpoint_saves=saves, first_step_seconds=0.1)
    )
    write_json_atomic(tmp_path / "summary.json", summary)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert set(GPT_REQUIRED_KEYS) <= set(written)
    assert written["summary_version"] == GPT_SUMMARY_VERSION
    assert 3.0 <= written["wall_seconds"] < 60
    # The time budget: every phase once, in order, adding up to the wall time.
    seconds = written["time_budget"]
    assert list(seconds) == [name for name in GPT_TIME_BUDGET_PARTS if name in seconds]
    assert sum(seconds.values()) == pytest.approx(written["wall_seconds"], abs=0.01)
    assert seconds["imports"] >= 3.0 and seconds["data"] >= 0.05
    assert seconds["first_step"] == 0.1 and seconds["checkpoint_saves"] == 0.05
    assert seconds["steps"] == pytest.approx(0.2 - 0.15, abs=0.05)
    assert written["checkpoint_saves"] == saves and written["compile"] is None
    # This session ran steps 5..10: 6 x 256 tokens in 2 s.
    assert written["tokens_per_second"] == 6 * 256 / 2.0
    assert written["mfu"] == written["tokens_per_second"] * 6000.0 / 1e9
    assert written["tokens_trained"] == 10 * 256 and written["resumed_from_step"] == 4
    assert written["final_loss"] == 5.0 and written["final_loss_window"] == 3
    assert written["verdict"] == "pass" and written["replicas_in_sync"] is True
    assert written["perplexity"] == math.exp(5.5)
    assert written["bits_per_byte"] == 5.5 * 250 / 1000 / math.log(2)
    assert written["peak_memory_gib"] == 2.0  # the fullest process
    assert written["parallelism"] == {
        "strategy": "fsdp2",
        "distributed_type": "FSDP",
        "num_processes": 2,
        "ranks": RANKS,
    }
    line = headline(written)
    assert line.startswith(
        "final loss 5.000 (below 7), eval loss 5.500 (1.984 bits/byte), 2,560 tokens, "
        "768 tokens/s; 3."
    )
    assert "s: imports 3." in line and ", first step 0.1, steps 0." in line


def test_a_budget_rounded_up_to_whole_batches_is_stated_with_the_tokens_trained():
    summary = run_summary(dataclasses.replace(PLAN, token_budget=2000), SETUP, result())
    assert summary["tokens_trained"] == 2560 and summary["token_budget"] == 2000
    assert "2,560 tokens (the budget 2,000, rounded up)" in headline(summary)


def test_judgements_without_losses_speed_or_peak():
    summary = run_summary(
        PLAN,
        dataclasses.replace(SETUP, peak_flops_per_second=None),
        result(logged_losses=[], eval_loss=None, loop_seconds=None, replica_checksums=None),
    )
    assert summary["final_loss"] is None and summary["verdict"] == "fail"
    assert summary["bits_per_byte"] is None and summary["perplexity"] is None
    assert summary["tokens_per_second"] is None and summary["mfu"] is None
    assert summary["replicas_in_sync"] is None  # sharded: not compared
    assert headline(summary).startswith("final loss n/a (NOT below 7), eval loss n/a (n/a")
    # the threshold itself fails
    assert run_summary(PLAN, SETUP, result(logged_losses=[7.0]))["verdict"] == "fail"
    assert (
        run_summary(PLAN, SETUP, result(replica_checksums=["a", "b"]))["replicas_in_sync"] is False
    )
    assert run_summary(PLAN, SETUP, result(eval_loss=1e6))["perplexity"] is None


def test_final_loss_is_the_mean_of_the_last_logged_losses():
    assert final_training_loss([6.0, 4.0, 2.0], window=2) == (3.0, 2)
    assert final_training_loss([6.0, 4.0, 2.0], window=10) == (4.0, 3)
    assert final_training_loss([], window=5) == (None, 0)


def test_a_diverged_run_has_no_final_loss_and_never_passes():
    diverged = result(logged_losses=[0.0, 0.0], diverged_at_step=6, divergence="grad_norm nan")
    summary = run_summary(PLAN, SETUP, diverged)
    assert summary["verdict"] == "diverged" and summary["diverged_at_step"] == 6
    # Trainer logs a window of NaN losses as 0 (--logging_nan_inf_filter): never a pass.
    assert summary["final_loss"] is None and summary["verdict"] != "pass"
    assert headline(summary) == (
        "DIVERGED at step 6 (grad_norm nan): no final loss to hold against 7"
    )
    assert run_summary(PLAN, SETUP, result())["verdict"] == "pass"
    assert run_summary(PLAN, SETUP, result(logged_losses=[8.0]))["verdict"] == "fail"
