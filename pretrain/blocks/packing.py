"""The packing rules: how the corpus becomes fixed-length blocks of token ids (the cache that
holds them: pretrain/blocks/cache.py), in the order they are applied:

1. Documents come from the shared corpus reader (`common.corpus.iter_documents`), in its order.
2. Tokenization is `tokenizers`' batch encode (no special tokens added, special-token text
   inside a document read as plain text); `<|endoftext|>` (the eos token) follows every
   document, so it marks exactly the document boundaries. A document longer than 65,536
   characters is tokenized in pieces cut before a space (`common.tokenization.cut_into_pieces`):
   with GPT-2's byte-level pre-tokenizer that changes no token, with others it may at a cut.
3. The split is by document: each document gets a 64-bit hash of its text keyed by
   `--split_seed`; the documents with the smallest hashes, `ceil(validation_fraction x
   documents)` of them and more until they fill a block, are the validation split, so a
   document's split depends only on its text and the seed. `document_split.json` (in the cache
   and every run folder trained on it) lists each split's document hashes. A corpus that cannot
   be split so (too few documents, e.g. one long one) is refused as such.
4. Each split's token stream (its documents in corpus order) is cut into `block_size` blocks
   over the whole stream, so blocks never depend on batching; at most one remainder per split
   is dropped.
5. `--max_train_tokens` keeps exactly `ceil(max_train_tokens / block_size)` training blocks,
   the first of a shuffle of the packed blocks seeded by `--split_seed`: a uniform sample of
   the corpus, a smaller budget's blocks a prefix of a larger one's. Fewer blocks than the
   budget: further shuffles follow until the budget is filled, so only what is missing is
   repeated, and a line says how much; without `--repeat_corpus` only up to `MAX_TOP_UP` of
   the budget (more is an error, and a corpus whose bytes cannot give the rest even at
   `MIN_BYTES_PER_TOKEN` is refused before it is read). Without a budget all training blocks
   are kept, in stream order.
6. Only `input_ids` is stored (int32, length `block_size`); the model shifts the labels.

Memory does not grow with the corpus: token ids go to files in the unfinished cache folder as
they come (the whole stream, then one per split), a document leaves 24 bytes, and each split's
Arrow file is written 1,000 blocks at a time; only the reader's de-duplication record (~100
bytes a document) and the longest document add to that.
"""

import dataclasses
import logging
import math
import time
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa

from common.cli import InputError
from common.corpus import (
    CorpusArguments,
    CorpusStats,
    corpus_bytes,
    document_hash,
    iter_documents,
)
from common.files import file_digests, write_json_atomic
from common.run_contract import DOCUMENT_SPLIT_FILE
from common.system import library_versions
from common.tokenization import tokenize_stream
from pretrain.blocks.args import DataArguments

logger = logging.getLogger(__name__)

# Bump when the blocks made from the same inputs change, so older caches are not reused.
# 5: a document over 65,536 characters is tokenized in pieces (rule 2). 6: each split is one
# Arrow file, BLOCKS_FILE (was save_to_disk's layout); the blocks are the same.
PIPELINE_VERSION = 6
STATS_FILE = "stats.json"
SPLITS = ("train", "validation")
# A split's blocks: one Arrow stream file that `datasets.Dataset.from_file` reads.
BLOCKS_FILE = "{}.arrow"
BATCH_BLOCKS = 1000  # blocks per Arrow record batch, the most in memory while writing
# Token streams spilled into the unfinished cache folder while building, removed before the end.
STREAM_FILE = "{}.int32"
ROUTE_CHUNK_TOKENS = 1 << 20
# The share of the budget repeated without --repeat_corpus: the course's 12M tokens on a
# corpus, or a tokenizer, that gives a little less (docs/PRETRAINING.md, "The real corpus").
MAX_TOP_UP = 0.25
# Fewer bytes a token than any tokenizer measured here gives on English (2.28 at 512 tokens of
# vocabulary, 3.24 at 2,048, 4.61 at 32,768): a corpus's bytes at this rate bound its tokens.
MIN_BYTES_PER_TOKEN = 2


def num_budget_blocks(max_train_tokens: int, block_size: int) -> int:
    """Blocks that hold the budget: ceil(max_train_tokens / block_size)."""
    return -(-max_train_tokens // block_size)


def build_blocks(
    folder: Path,
    corpus_args: CorpusArguments,
    data_args: DataArguments,
    tokenizer,
    context: dict[str, Any],
) -> None:
    """Read, tokenize, split, pack and save into `folder`, stats.json last."""
    if data_args.max_train_tokens is not None and not data_args.repeat_corpus:
        check_corpus_can_fill(corpus_args, data_args)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    corpus_stats = CorpusStats()
    split_key, block_size = str(data_args.split_seed), data_args.block_size
    # Per document: its keyed hash, its bytes as a line of X.txt (UTF-8 text and newline), and
    # where its tokens end in the stream.
    hashes, document_bytes, batch_ends = array("Q"), array("q"), []

    def recorded(documents: Iterable[str]) -> Iterator[str]:
        for text in documents:
            hashes.append(document_hash(text, split_key))
            document_bytes.append(len(text.encode()) + 1)
            yield text

    num_tokens = 0
    documents = recorded(iter_documents(corpus_args, corpus_stats))
    with (folder / STREAM_FILE.format("all")).open("wb") as stream:
        for token_ids, ends in tokenize_stream(documents, tokenizer):
            stream.write(token_ids)
            batch_ends.append(ends + num_tokens)
            num_tokens += len(token_ids)
    document_ends = np.concatenate(batch_ends)
    document_lengths = np.diff(document_ends, prepend=0)
    document_bytes = np.frombuffer(document_bytes, np.int64)
    seconds["read_and_tokenize"] = time.perf_counter() - started

    started = time.perf_counter()
    hashes = np.frombuffer(hashes, np.uint64)
    is_validation = choose_validation_documents(
        hashes, document_lengths, data_args.validation_fraction, block_size
    )
    masks = {"validation": is_validation, "train": ~is_validation}
    num_split_tokens = {split: int(document_lengths[mask].sum()) for split, mask in masks.items()}
    num_packed = {split: n // block_size for split, n in num_split_tokens.items()}
    selected = {split: np.arange(n) for split, n in num_packed.items()}
    if data_args.max_train_tokens is not None:
        num_selected = num_budget_blocks(data_args.max_train_tokens, block_size)
        num_missing = num_selected - num_packed["train"]
        if num_missing > MAX_TOP_UP * num_selected and not data_args.repeat_corpus:
            raise InputError(
                f"the training split has {num_split_tokens['train']:,} tokens "
                f"({num_packed['train']:,} blocks of {block_size}), more than {MAX_TOP_UP:.0%} "
                f"short of --max_train_tokens {data_args.max_train_tokens:,} ({num_selected:,} "
                "blocks); pass --repeat_corpus to repeat it, lower --max_train_tokens or add "
                "documents"
            )
        if num_missing > 0:
            logger.info(
                f"the training split gives {num_packed['train'] * block_size:,} of the "
                f"budget's {num_selected * block_size:,} tokens; repeating "
                f"{num_missing * block_size:,} of them ({num_missing / num_packed['train']:.0%}, "
                "a seeded sample of its blocks)"
            )
        selected["train"] = select_training_blocks(
            num_packed["train"], num_selected, data_args.split_seed
        )
    # Which documents each split holds, by keyed hash: what later stages (the probe) read to
    # know which texts pretraining trained on and which it held out.
    write_json_atomic(
        folder / DOCUMENT_SPLIT_FILE,
        {
            "hash": "BLAKE2b, 8 bytes, of each document's UTF-8 text keyed by `key` "
            "(common.corpus.document_hashes), as 16 hex digits",
            "key": split_key,
            **{split: [f"{value:016x}" for value in hashes[mask]] for split, mask in masks.items()},
        },
    )
    token_counts = route_tokens(folder, document_ends, is_validation, len(tokenizer))
    seconds["pack"] = time.perf_counter() - started

    started = time.perf_counter()
    num_evaluated_bytes = 0
    for split in SPLITS:
        stream = folder / STREAM_FILE.format(split)
        path = folder / BLOCKS_FILE.format(split)
        for blocks in save_split(path, stream, selected[split], block_size):
            if split == "validation":
                num_evaluated_bytes += count_predicted_bytes(blocks, tokenizer)
        stream.unlink()
    seconds["save"] = time.perf_counter() - started

    split_stats = {}
    for split in SPLITS:
        split_stats[split] = {
            "num_documents": int(np.count_nonzero(masks[split])),
            "num_tokens": num_split_tokens[split],
            "num_bytes": int(document_bytes[masks[split]].sum()),
            "num_packed_blocks": num_packed[split],
            "num_dropped_tokens": num_split_tokens[split] - num_packed[split] * block_size,
            "num_blocks": len(selected[split]),
            "passes_over_packed_blocks": len(selected[split]) / num_packed[split],
            "unigram_entropy_nats": unigram_entropy(token_counts[split]),
        }
    split_stats["validation"]["num_evaluated_tokens"] = num_packed["validation"] * (block_size - 1)
    split_stats["validation"]["num_evaluated_bytes"] = num_evaluated_bytes
    stats = {
        "pipeline_version": PIPELINE_VERSION,
        **context,
        "corpus_sources": corpus_stats.sources,
        "num_documents": corpus_stats.num_documents,
        "num_duplicate_documents_dropped": corpus_stats.num_duplicates,
        "num_nul_bytes": corpus_stats.num_nul_bytes,
        "num_bytes": corpus_stats.num_bytes,
        "num_tokens": num_tokens,
        "tokens_per_document": num_tokens / corpus_stats.num_documents,
        "tokens_counted": "token ids plus one end-of-text per document",
        "unigram_entropy_nats": split_stats["train"]["unigram_entropy_nats"],
        "tokenizer_dir": str(Path(data_args.tokenizer_dir).resolve()),
        "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "splits": split_stats,
        "settings": dataclasses.asdict(data_args),
        "seconds": {name: round(value, 3) for name, value in seconds.items()},
        "versions": library_versions(),
    }
    # Recorded last, over every file but this one: a reuse checks that they are still whole.
    stats["files"] = file_digests(folder)
    write_json_atomic(folder / STATS_FILE, stats)
    train = split_stats["train"]
    logger.info(
        f"{corpus_stats.num_documents:,} documents, {num_tokens:,} tokens: "
        f"{train['num_blocks']:,} training blocks ({train['num_dropped_tokens']} dropped tokens), "
        f"{split_stats['validation']['num_blocks']:,} validation blocks; unigram entropy "
        f"{train['unigram_entropy_nats']:.3f} nats"
    )


def check_corpus_can_fill(corpus_args: CorpusArguments, data_args: DataArguments) -> None:
    """Refuse, from the input files' bytes and before anything is read, a corpus that cannot
    give the budget less `MAX_TOP_UP` even at `MIN_BYTES_PER_TOKEN`."""
    budget = num_budget_blocks(data_args.max_train_tokens, data_args.block_size)
    budget *= data_args.block_size
    num_bytes = corpus_bytes(corpus_args)
    if num_bytes / MIN_BYTES_PER_TOKEN < (1 - MAX_TOP_UP) * budget:
        raise InputError(
            f"the corpus holds {num_bytes:,} bytes, at most about "
            f"{num_bytes // MIN_BYTES_PER_TOKEN:,} tokens even at {MIN_BYTES_PER_TOKEN} bytes a "
            f"token (every tokenizer measured gives more on English), far below --max_train_tokens "
            f"{budget:,}; add documents, lower --max_train_tokens or pass --repeat_corpus to "
            "repeat it"
        )


def route_tokens(
    folder: Path, document_ends: np.ndarray, is_validation: np.ndarray, vocab_size: int
) -> dict[str, np.ndarray]:
    """Move the whole token stream's ids into one stream per split (their documents in corpus
    order), a chunk at a time; return each split's count of every token id."""
    counts = {split: np.zeros(vocab_size, np.int64) for split in SPLITS}
    whole = folder / STREAM_FILE.format("all")
    outputs = {split: (folder / STREAM_FILE.format(split)).open("wb") for split in SPLITS}
    with whole.open("rb") as source, outputs["train"], outputs["validation"]:
        for start in range(0, int(document_ends[-1]), ROUTE_CHUNK_TOKENS):
            token_ids = np.fromfile(source, np.int32, ROUTE_CHUNK_TOKENS)
            positions = np.arange(start, start + len(token_ids))  # -> their documents
            in_validation = is_validation[np.searchsorted(document_ends, positions, "right")]
            for split, in_split in (("train", ~in_validation), ("validation", in_validation)):
                outputs[split].write(token_ids[in_split])
                counts[split] += np.bincount(token_ids[in_split], minlength=vocab_size)
    whole.unlink()
    return counts


def choose_validation_documents(
    hashes: np.ndarray, document_lengths: np.ndarray, validation_fraction: float, block_size: int
) -> np.ndarray:
    """Boolean mask of the validation documents, by their keyed hashes (rule 3 above)."""
    order = np.argsort(hashes, kind="stable")
    tokens_so_far = np.cumsum(document_lengths[order])
    num_total = int(tokens_so_far[-1])
    num_for_one_block = int(np.searchsorted(tokens_so_far, block_size)) + 1
    num_validation = max(math.ceil(validation_fraction * len(hashes)), num_for_one_block)
    if num_validation >= len(hashes) or num_total - tokens_so_far[num_validation - 1] < block_size:
        if num_total < 2 * block_size:
            raise InputError(
                f"the corpus has {num_total:,} tokens in {len(hashes):,} documents (with one "
                f"end-of-text each): too few for one training and one validation block of "
                f"{block_size}; add documents or lower --block_size"
            )
        raise InputError(
            f"the corpus's {len(hashes):,} document(s) ({num_total:,} tokens) cannot be split "
            "by document into a training and a validation part of one block each: the "
            f"validation part would take {min(num_validation, len(hashes)):,} of them; add "
            "documents (or lower --validation_fraction)"
        )
    is_validation = np.zeros(len(hashes), bool)
    is_validation[order[:num_validation]] = True
    return is_validation


def pack_blocks(token_stream: np.ndarray, block_size: int) -> tuple[np.ndarray, int]:
    """Consecutive `block_size` blocks of the stream (a view) and the dropped tail length."""
    # Kept over run_clm's `group_texts` (Python lists per map batch): measured 4.5-5x faster
    # after tokenization and drops one remainder per split, not per batch (docs/BENCHMARKS.md).
    num_blocks = len(token_stream) // block_size
    blocks = token_stream[: num_blocks * block_size].reshape(num_blocks, block_size)
    return blocks, len(token_stream) - num_blocks * block_size


def select_training_blocks(num_blocks: int, num_selected: int, seed: int) -> np.ndarray:
    """Indices of the budget's blocks: the first `num_selected` of successive seeded shuffles."""
    rng = np.random.default_rng(seed)
    num_passes = -(-num_selected // num_blocks)
    return np.concatenate([rng.permutation(num_blocks) for _ in range(num_passes)])[:num_selected]


def count_predicted_bytes(blocks: np.ndarray, tokenizer) -> int:
    """UTF-8 bytes of the text a loss over `blocks` predicts (what bits per byte divide by):
    each block's tokens after its first, an end-of-text counted as its document's newline. Only
    a character cut by a block's edge decodes differently (as one replacement character)."""
    predicted = blocks[:, 1:]
    is_eos = predicted == tokenizer.eos_token_id
    texts = tokenizer.backend_tokenizer.decode_batch(
        [row[~eos].tolist() for row, eos in zip(predicted, is_eos, strict=True)],
        skip_special_tokens=False,
    )
    return sum(len(text.encode()) for text in texts) + int(is_eos.sum())


def unigram_entropy(token_counts: np.ndarray) -> float:
    """Entropy in nats of the token frequencies: the cross-entropy floor of a context-free model."""
    probabilities = token_counts[token_counts > 0] / token_counts.sum()
    return float(-(probabilities * np.log(probabilities)).sum())


def save_split(
    path: Path, stream_path: Path, selected: np.ndarray, block_size: int
) -> Iterator[np.ndarray]:
    """Write the `selected` blocks of a split's stream to `path` as an Arrow stream that
    `Dataset.from_file` reads, one record batch at a time; yield each batch's blocks."""
    features = {"input_ids": datasets.List(datasets.Value("int32"), length=block_size)}
    schema = datasets.Features(features).arrow_schema
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for start in range(0, len(selected), BATCH_BLOCKS):
            stream = np.memmap(stream_path, np.int32, "r")
            blocks = pack_blocks(stream, block_size)[0][selected[start : start + BATCH_BLOCKS]]
            del stream  # `blocks` is a copy: the pages read are let go with the mapping
            values = pa.FixedSizeListArray.from_arrays(pa.array(blocks.reshape(-1)), block_size)
            writer.write_batch(pa.record_batch([values], schema=schema))
            yield blocks
