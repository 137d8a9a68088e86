"""The options of block preparation: which tokenizer, how long the blocks are, how the corpus is
split and budgeted. `prepare-blocks` and every training entry point take `DataArguments`."""

from __future__ import annotations

from dataclasses import dataclass

from transformers.hf_argparser import HfArg

from common.cli import InputError


@dataclass
class DataArguments:
    """Which tokenizer, how long the blocks are, how the corpus is split and budgeted."""

    tokenizer_dir: str = HfArg(
        help="Tokenizer folder (from train-tokenizer, or any saved Hugging Face fast "
        "tokenizer with an eos token, e.g. GPT-2's)."
    )
    cache_dir: str = HfArg(
        default="data/cache",
        help="Folder that holds the packed-block caches, one subfolder per input.",
    )
    block_size: int = HfArg(default=1024, help="Tokens per training example (the context length).")
    validation_fraction: float = HfArg(
        default=0.005,
        help="Share of documents held out for validation (at least enough for one block).",
    )
    max_train_tokens: int | None = HfArg(
        default=None,
        help="Token budget (12000000, or 12M): keep exactly ceil(max_train_tokens / "
        "block_size) training blocks, a seeded random sample of the corpus (default: all).",
    )
    repeat_corpus: bool = HfArg(
        default=False,
        help="Allow a corpus of any size below --max_train_tokens: repeat it (reshuffled "
        "each pass) to fill the budget. Without it a training split up to 25%% short is "
        "topped up so (in one line) and a shorter one is an error.",
    )
    split_seed: int = HfArg(
        default=0,
        help="Seed of the document hash that picks the validation split and of the "
        "shuffle that picks the budget's training blocks.",
    )

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise InputError(f"--block_size {self.block_size} is too small; pass at least 2")
        if not 0.0 < self.validation_fraction < 1.0:
            raise InputError(
                f"--validation_fraction {self.validation_fraction} must be between 0 and 1 "
                "(exclusive), e.g. 0.005"
            )
        if self.max_train_tokens is not None and self.max_train_tokens < 1:
            raise InputError(f"--max_train_tokens {self.max_train_tokens} must be at least 1")
