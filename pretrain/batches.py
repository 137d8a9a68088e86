"""Batches and steps of training over packed blocks: the collator Trainer stacks blocks with,
and the schedule of one pass over the training blocks."""

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from common.cli import InputError

logger = logging.getLogger(__name__)


def collate_blocks(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack packed blocks into a batch; the labels are the inputs (the model shifts them). No
    attention mask: every block is full."""
    input_ids = torch.stack([torch.as_tensor(example["input_ids"]) for example in examples])
    input_ids = input_ids.long()  # (batch, block_size); int64 for the embedding and the loss
    return {"input_ids": input_ids, "labels": input_ids}


@dataclass(frozen=True)
class BlockSchedule:
    """How training walks the blocks: `batch_blocks` per optimizer step, `max_steps` steps."""

    num_train_blocks: int
    batch_blocks: int
    block_size: int
    max_steps: int

    @classmethod
    def one_pass(
        cls, num_train_blocks: int, batch_blocks: int, block_size: int, requested_max_steps: int
    ) -> "BlockSchedule":
        """The steps that show every training block once, the last taking the remainder; a
        positive `requested_max_steps` may stop earlier (a quick check), never later."""
        if num_train_blocks < batch_blocks:
            raise InputError(
                f"the training split has {num_train_blocks} blocks, fewer than one global batch "
                f"of {batch_blocks}; raise --max_train_tokens (or use a bigger corpus) or lower "
                "--per_device_train_batch_size / --gradient_accumulation_steps"
            )
        steps = math.ceil(num_train_blocks / batch_blocks)
        if requested_max_steps > steps:
            raise InputError(
                f"--max_steps {requested_max_steps} would go past one pass over the "
                f"{num_train_blocks} training blocks ({steps} steps); raise --max_train_tokens "
                "instead"
            )
        if requested_max_steps > 0:
            logger.warning(
                "stopping after --max_steps %d of the %d steps the token budget allows",
                requested_max_steps, steps,
            )  # fmt: skip
            steps = requested_max_steps
        return cls(num_train_blocks, batch_blocks, block_size, steps)

    @property
    def last_batch_blocks(self) -> int:
        """Blocks in the last step: a full batch, or what is left of one pass."""
        return min(
            self.batch_blocks, self.num_train_blocks - (self.max_steps - 1) * self.batch_blocks
        )

    @property
    def batch_tokens(self) -> int:
        return self.batch_blocks * self.block_size

    def tokens_seen(self, step: int) -> int:
        """Training tokens consumed after `step` optimizer steps (the last step may be partial)."""
        return min(step * self.batch_blocks, self.num_train_blocks) * self.block_size

    def tokens_between(self, start_step: int, end_step: int) -> int:
        """Training tokens of the steps after `start_step` up to `end_step`."""
        return self.tokens_seen(end_step) - self.tokens_seen(start_step)
