"""GPT-2 style byte-level BPE: build, train from a stream of documents, wrap, measure.

Byte-level means the model's alphabet is the 256 byte values (shown as printable characters),
so any text, in any script, encodes without an unknown token. Training only decides which
byte sequences get merged into single tokens.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

END_OF_TEXT = "<|endoftext|>"
# A pad distinct from end-of-text: the causal-LM collator masks pad positions in the labels, so
# with pad == eos the model would never learn to predict the end of a document.
PAD = "<pad>"
# Special tokens come first in the vocabulary, so their ids are 0 and 1 whatever the corpus.
SPECIAL_TOKENS = (END_OF_TEXT, PAD)
MIN_VOCAB_SIZE = len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIAL_TOKENS)


def train_bpe(
    documents: Iterable[str],
    vocab_size: int,
    num_documents: int | None = None,
    min_frequency: int = 2,
    batch_size: int = 1000,
    show_progress: bool = True,
) -> Tokenizer:
    """Learn BPE merges from a stream of documents; memory grows with distinct words, not text.
    `num_documents` only sizes the progress bar. The result is deterministic for a given stream."""
    tokenizer = Tokenizer(models.BPE())
    # add_prefix_space=False: GPT-2 does not insert a space before the first word.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # Keeps character offsets pointing at the text rather than at the leading space.
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 bytes, seen or not: without them bytes absent from training would be dropped
        # at encoding time instead of round-tripping.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        # Into a file or a pipe the bars draw nothing but a blank line per stage.
        show_progress=show_progress and sys.stderr.isatty(),
    )
    # Lists of up to `batch_size` documents: tokenizers pre-tokenizes each batch in parallel.
    iterator = iter(documents)
    batches = iter(lambda: list(itertools.islice(iterator, batch_size)), [])
    # `length` counts documents, not batches: tokenizers flattens the batches it is given.
    with _stdout_to_stderr():
        tokenizer.train_from_iterator(batches, trainer, length=num_documents)
    if tokenizer.get_vocab_size() < vocab_size:
        logger.warning(
            "the corpus supports only %d of the %d requested tokens (no pair left to merge "
            "at min_frequency=%d)",
            tokenizer.get_vocab_size(),
            vocab_size,
            min_frequency,
        )
    return tokenizer


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr for a while: the tokenizers trainer draws its bars on
    stderr but prints a newline on stdout after each stage, into a command's printed result."""
    sys.stdout.flush()
    saved_stdout = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)


def wrap_for_transformers(tokenizer: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    """The `transformers` tokenizer that `AutoTokenizer.from_pretrained` gives back after saving."""
    from transformers import PreTrainedTokenizerFast  # slow to import; only saving needs it

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=PAD,
        model_max_length=model_max_length,
    )


def measure_compression(tokenizer: Tokenizer, documents: list[str]) -> dict[str, Any] | None:
    """How compactly the tokenizer encodes `documents`: their counts, bytes per token and tokens
    per (whitespace-separated) word."""
    if not documents:
        return None
    num_tokens = sum(len(encoding.ids) for encoding in tokenizer.encode_batch(documents))
    num_bytes = sum(len(document.encode("utf-8")) for document in documents)
    num_words = sum(len(document.split()) for document in documents)
    return {
        "num_documents": len(documents),
        "num_bytes": num_bytes,
        "num_words": num_words,
        "num_tokens": num_tokens,
        "bytes_per_token": num_bytes / num_tokens,
        "tokens_per_word": num_tokens / num_words,
    }
