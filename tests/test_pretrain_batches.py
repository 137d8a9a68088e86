"""Training batches over packed blocks: the collator and the one-pass schedule."""

import pytest
import torch

from common.cli import InputError
from pretrain.batches import BlockSchedule, collate_blocks


def test_collated_batch_is_int64_inputs_that_are_also_the_labels():
    blocks = [{"input_ids": torch.arange(8, dtype=torch.int32)} for _ in range(2)]
    batch = collate_blocks(blocks)
    assert batch["input_ids"].dtype == torch.int64
    assert batch["input_ids"].shape == (2, 8)
    assert batch["labels"] is batch["input_ids"]


def test_one_pass_shows_every_block_once_with_a_partial_last_step():
    schedule = BlockSchedule.one_pass(10, batch_blocks=4, block_size=8, requested_max_steps=-1)
    assert schedule.max_steps == 3 and schedule.batch_tokens == 32
    assert [schedule.tokens_seen(step) for step in range(4)] == [0, 32, 64, 80]
    assert BlockSchedule.one_pass(10, 4, 8, requested_max_steps=2).max_steps == 2


def test_one_pass_refuses_too_few_blocks_or_more_steps_than_a_pass():
    with pytest.raises(InputError, match="fewer than one global batch of 4"):
        BlockSchedule.one_pass(3, batch_blocks=4, block_size=8, requested_max_steps=-1)
    with pytest.raises(InputError, match="--max_steps 4 would go past one pass"):
        BlockSchedule.one_pass(10, batch_blocks=4, block_size=8, requested_max_steps=4)
