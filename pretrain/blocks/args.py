"""The options of block preparation, which `prepare-blocks` and every training entry point take."""

from dataclasses import dataclass

from transformers.hf_argparser import HfArg

from common.values import SHARE, Range, at_least


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
    block_size: int = HfArg(
        default=1024,
        help="Tokens per training example (the context length).",
        metadata={"range": at_least(2)},
    )
    validation_fraction: float = HfArg(
        default=0.005,
        help="Share of documents held out for validation (at least enough for one block).",
        metadata={"range": SHARE},
    )
    max_train_tokens: int | None = HfArg(
        default=None,
        help="Token budget (12000000, or 12M): keep exactly ceil(max_train_tokens / "
        "block_size) training blocks, a seeded random sample of the corpus (default: all).",
        # 10**12: a trillion tokens, weeks of a GPU node for GPT-2 117M, beyond any run here.
        metadata={"range": Range(lambda tokens: 1 <= tokens <= 10**12, "1 to 10**12 tokens")},
    )
    repeat_corpus: bool = HfArg(
        default=False,
        help="Repeat a corpus of any size to fill --max_train_tokens (reshuffled each pass); "
        "without it only a split up to 25%% short is topped up.",
    )
    split_seed: int = HfArg(
        default=0,
        help="Seed of the document hash that picks the validation split and of the "
        "shuffle that picks the budget's training blocks.",
    )
