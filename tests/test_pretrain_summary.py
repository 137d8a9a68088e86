"""run_summary.json: each part lands under its keys, and the judgements derived from them."""

from __future__ import annotations

import json
import math

from common.run_contract import GPT_REQUIRED_KEYS, GPT_SUMMARY_VERSION
from pretrain.summary import (
    LoopRecord,
    OutcomeRecord,
    ParallelismRecord,
    PlanRecord,
    RunSummary,
    SetupRecord,
    final_training_loss,
)

PLAN = PlanRecord(max_steps=10, global_batch_tokens=256, resumed_from_step=4, data={"n": 1})
SETUP = SetupRecord(
    num_parameters=1000,
    flops_per_token=6000.0,
    num_processes=2,
    accelerator_state="Device: cpu",
    speed_settings={"batch": 4},
    config={"ModelArguments": {"model_preset": "tiny"}},
)
LOOP = LoopRecord(
    train_loop_seconds=2.0,
    first_step_seconds=0.5,
    peak_memory_gib=None,
    tokens_per_second=768.0,
    mfu=0.01,
)
RANKS = [{"rank": rank, "parameter_bytes": 400} for rank in range(2)]
PARALLELISM = ParallelismRecord(
    strategy="fsdp2", distributed_type="FSDP", num_processes=2, ranks=RANKS
)


def outcome(**changes) -> OutcomeRecord:
    values = {
        "global_step": 10,
        "tokens_trained": 2560,
        "final_loss": 5.0,
        "final_loss_window": 3,
        "loss_threshold": 7.0,
        "eval_loss": 5.5,
        "validation_tokens_per_byte": 0.25,
        "replica_checksums": ["a", "a"],
        **changes,
    }
    return OutcomeRecord(**values)


def test_summary_holds_every_part_and_the_required_keys(tmp_path):
    summary = RunSummary(
        wall_seconds=3.0,
        plan=PLAN,
        setup=SETUP,
        loop=LOOP,
        outcome=outcome(),
        parallelism=PARALLELISM,
    )
    summary.write(tmp_path / "summary.json")
    written = json.loads((tmp_path / "summary.json").read_text())
    assert set(GPT_REQUIRED_KEYS) <= set(written)
    assert written["summary_version"] == GPT_SUMMARY_VERSION
    assert written["resumed_from_step"] == 4 and written["num_processes"] == 2
    assert written["tokens_per_second"] == 768.0 and written["tokens_trained"] == 2560
    assert written["config"] == {"ModelArguments": {"model_preset": "tiny"}}
    assert written["loss_below_threshold"] is True and written["replicas_in_sync"] is True
    assert written["perplexity"] == math.exp(5.5)
    assert written["bits_per_byte"] == 5.5 * 0.25 / math.log(2)
    assert written["parallelism"] == {
        "strategy": "fsdp2",
        "distributed_type": "FSDP",
        "num_processes": 2,
        "ranks": RANKS,
    }
    assert summary.headline() == (
        "final loss 5.000 (below 7), eval loss 5.500 (1.984 bits/byte), 768 tokens/s"
    )


def test_judgements_of_the_outcome():
    assert not outcome(final_loss=7.0).loss_below_threshold  # the threshold itself fails
    assert not outcome(final_loss=None).loss_below_threshold
    assert outcome(replica_checksums=["a", "b"]).replicas_in_sync is False
    assert outcome(replica_checksums=None).replicas_in_sync is None  # sharded: not compared
    assert outcome(eval_loss=1e6).perplexity is None  # overflow
    no_losses = RunSummary(
        3.0, PLAN, SETUP, LOOP, outcome(final_loss=None, eval_loss=None), PARALLELISM
    )
    assert no_losses.headline().startswith("final loss n/a (NOT below 7), eval loss n/a (n/a")
    assert outcome(validation_tokens_per_byte=None).bits_per_byte is None


def test_final_loss_is_the_mean_of_the_last_logged_losses():
    history = [{"loss": 6.0}, {"eval_loss": 9.0}, {"loss": 4.0}, {"loss": 2.0}]
    assert final_training_loss(history, window=2) == (3.0, 2)
    assert final_training_loss(history, window=10) == (4.0, 3)
    assert final_training_loss([{"eval_loss": 1.0}], window=5) == (None, 0)
