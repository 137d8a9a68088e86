"""The packing rules: how the corpus becomes fixed-length blocks of token ids (the cache that
holds them: pretrain/blocks/cache.py).

The rules, in the order they are applied:

1. Documents come from the shared corpus reader (`common.corpus.iter_documents`), in its order.
2. Tokenization is a batched `datasets` map over the documents (`--num_proc` processes, fast
   tokenizer, no special tokens added by the tokenizer, special-token text inside a document
   read as plain text); `<|endoftext|>` (the tokenizer's eos token) is appended after every
   document, so it marks exactly the document boundaries in the stream.
3. The split is by document: each document gets a 64-bit hash of its text keyed by
   `--split_seed`; the documents with the smallest hashes, `ceil(validation_fraction x
   documents)` of them, and more until they fill at least one block, are the validation split.
   A document's split therefore depends only on its text and the seed, not on its position or
   on the rest of the corpus. `document_split.json` in the cache folder (and in every run
   folder trained on it) lists each split's document hashes.
4. Each split's token stream (its documents in corpus order, eos after each) is cut into
   `block_size` blocks with numpy, over the whole stream at once: blocks never depend on
   `--num_proc` or the map batch size, and at most one remainder (< block_size tokens) per split
   is dropped.
5. `--max_train_tokens` keeps exactly `ceil(max_train_tokens / block_size)` training blocks
   (12,000,000 tokens -> 11,719 blocks of 1024): the first ones of a shuffle of the packed
   blocks seeded by `--split_seed`, so the budget is a uniform sample of the corpus, not its
   first documents, and a smaller budget's blocks are a prefix of a larger one's. A corpus with
   fewer blocks than the budget is an error unless `--repeat_corpus`: then further shuffles
   (passes over the whole corpus) follow the first until the budget is filled. Without a budget
   all training blocks are kept, in stream order.
6. Only `input_ids` is stored (int32, fixed length `block_size`); the model shifts the labels.

For training, `collate_blocks` makes Trainer's batches and `BlockSchedule` counts the optimizer
steps of one pass over the training blocks and the tokens seen after each.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
import pyarrow as pa

from common.cli import InputError
from common.corpus import (
    CorpusArguments,
    CorpusStats,
    document_hashes,
    iter_documents,
)
from common.files import file_digests, write_json_atomic
from common.run_contract import DOCUMENT_SPLIT_FILE
from common.system import library_versions
from common.tokenization import tokenize_documents
from pretrain.blocks.args import DataArguments

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

# Bump when the blocks made from the same inputs change, so older caches are not reused.
PIPELINE_VERSION = 4
STATS_FILE = "stats.json"
SPLITS = ("train", "validation")


def num_budget_blocks(max_train_tokens: int, block_size: int) -> int:
    """Blocks that hold the budget: ceil(max_train_tokens / block_size)."""
    return -(-max_train_tokens // block_size)


def build_blocks(
    folder: Path,
    corpus_args: CorpusArguments,
    data_args: DataArguments,
    tokenizer,
    context: dict[str, Any],
) -> dict[str, Any]:
    """Read, tokenize, split, pack and save into `folder`; return what went into stats.json."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    corpus_stats = CorpusStats()
    documents = list(iter_documents(corpus_args, corpus_stats))
    seconds["read"] = time.perf_counter() - started

    started = time.perf_counter()
    token_ids, document_lengths = tokenize_documents(
        documents, tokenizer, data_args.num_proc, data_args.map_batch_size
    )
    seconds["tokenize"] = time.perf_counter() - started

    started = time.perf_counter()
    split_key = str(data_args.split_seed)
    hashes = document_hashes(documents, split_key)
    is_validation = choose_validation_documents(
        hashes, document_lengths, data_args.validation_fraction, data_args.block_size
    )
    write_document_split(folder / DOCUMENT_SPLIT_FILE, hashes, is_validation, split_key)
    token_is_validation = np.repeat(is_validation, document_lengths)
    # Each document's bytes as a line of X.txt: its UTF-8 text and the newline that ends it.
    document_bytes = np.fromiter((len(text.encode()) + 1 for text in documents), np.int64)
    streams = {
        "train": token_ids[~token_is_validation],
        "validation": token_ids[token_is_validation],
    }
    packed = {split: pack_blocks(stream, data_args.block_size) for split, stream in streams.items()}
    train_blocks, _ = packed["train"]
    if data_args.max_train_tokens is None:
        selected = np.arange(len(train_blocks))
    else:
        num_selected = num_budget_blocks(data_args.max_train_tokens, data_args.block_size)
        if num_selected > len(train_blocks) and not data_args.repeat_corpus:
            raise InputError(
                f"the training split has {len(streams['train']):,} tokens "
                f"({len(train_blocks):,} blocks of {data_args.block_size}), fewer than "
                f"--max_train_tokens {data_args.max_train_tokens:,} ({num_selected:,} blocks); "
                "pass --repeat_corpus to repeat it, lower --max_train_tokens or add documents"
            )
        selected = select_training_blocks(len(train_blocks), num_selected, data_args.split_seed)
    split_blocks = {"train": train_blocks[selected], "validation": packed["validation"][0]}
    seconds["pack"] = time.perf_counter() - started

    started = time.perf_counter()
    dataset_dict = datasets.DatasetDict(
        {split: blocks_dataset(blocks) for split, blocks in split_blocks.items()}
    )
    dataset_dict.save_to_disk(str(folder))
    seconds["save"] = time.perf_counter() - started

    vocab_size = len(tokenizer)
    validation_blocks = split_blocks["validation"]
    split_stats = {}
    for split in SPLITS:
        blocks, num_dropped = packed[split]
        split_is_validation = split == "validation"
        num_documents = int(np.count_nonzero(is_validation == split_is_validation))
        split_stats[split] = {
            "num_documents": num_documents,
            "num_tokens": len(streams[split]),
            "num_bytes": int(document_bytes[is_validation == split_is_validation].sum()),
            "num_packed_blocks": len(blocks),
            "num_dropped_tokens": num_dropped,
            "num_blocks": len(split_blocks[split]),
            "passes_over_packed_blocks": len(split_blocks[split]) / len(blocks),
            "unigram_entropy_nats": unigram_entropy(streams[split], vocab_size),
        }
    split_stats["validation"]["num_evaluated_tokens"] = validation_blocks[:, 1:].size
    split_stats["validation"]["num_evaluated_bytes"] = count_predicted_bytes(
        validation_blocks, tokenizer
    )
    stats = {
        "pipeline_version": PIPELINE_VERSION,
        **context,
        "corpus_sources": corpus_stats.sources,
        "num_documents": corpus_stats.num_documents,
        "num_duplicate_documents_dropped": corpus_stats.num_duplicates,
        "num_bytes": corpus_stats.num_bytes,
        "num_tokens": len(token_ids),
        "tokens_per_document": len(token_ids) / len(documents),
        "tokens_counted": "token ids plus one end-of-text per document",
        "unigram_entropy_nats": split_stats["train"]["unigram_entropy_nats"],
        "tokenizer_dir": str(Path(data_args.tokenizer_dir).resolve()),
        "vocab_size": vocab_size,
        "eos_token_id": tokenizer.eos_token_id,
        "splits": split_stats,
        "settings": dataclasses.asdict(data_args),
        "seconds": {name: round(value, 3) for name, value in seconds.items()},
        "versions": library_versions(),
    }
    # Recorded last, over every file but this one: a reuse checks that they are still whole.
    stats["files"] = file_digests(folder)
    write_json_atomic(folder / STATS_FILE, stats)
    logger.info(
        "%s documents, %s tokens: %s training blocks (%s dropped tokens), %s validation blocks; "
        "unigram entropy %.3f nats",
        f"{stats['num_documents']:,}",
        f"{stats['num_tokens']:,}",
        f"{split_stats['train']['num_blocks']:,}",
        split_stats["train"]["num_dropped_tokens"],
        f"{split_stats['validation']['num_blocks']:,}",
        stats["unigram_entropy_nats"],
    )
    return stats


def choose_validation_documents(
    hashes: np.ndarray, document_lengths: np.ndarray, validation_fraction: float, block_size: int
) -> np.ndarray:
    """Boolean mask of the validation documents (rule 3 of the module docstring), from their
    keyed hashes."""
    order = np.argsort(hashes, kind="stable")
    tokens_so_far = np.cumsum(document_lengths[order])
    num_total = int(tokens_so_far[-1])
    num_for_one_block = int(np.searchsorted(tokens_so_far, block_size)) + 1
    num_validation = max(math.ceil(validation_fraction * len(hashes)), num_for_one_block)
    if num_validation >= len(hashes) or num_total - tokens_so_far[num_validation - 1] < block_size:
        raise InputError(
            f"the corpus has {num_total:,} tokens in {len(hashes):,} documents (with one "
            f"end-of-text each): too few for one training and one validation block of "
            f"{block_size}; add documents or lower --block_size"
        )
    is_validation = np.zeros(len(hashes), bool)
    is_validation[order[:num_validation]] = True
    return is_validation


def write_document_split(
    path: Path, hashes: np.ndarray, is_validation: np.ndarray, split_key: str
) -> None:
    """Record which documents each split holds, by keyed hash: what later stages (the probe)
    read to know which texts pretraining trained on and which it held out."""
    write_json_atomic(
        path,
        {
            "hash": "BLAKE2b, 8 bytes, of each document's UTF-8 text keyed by `key` "
            "(common.corpus.document_hashes), as 16 hex digits",
            "key": split_key,
            **{
                split: [f"{value:016x}" for value in hashes[mask]]
                for split, mask in (("validation", is_validation), ("train", ~is_validation))
            },
        },
    )


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
    order = np.concatenate([rng.permutation(num_blocks) for _ in range(num_passes)])
    return order[:num_selected]


def count_predicted_bytes(blocks: np.ndarray, tokenizer) -> int:
    """UTF-8 bytes of the text a loss over `blocks` predicts: each block's tokens after its
    first, an end-of-text counted as the newline that ends its document's line.

    Bits per byte divide the validation loss by these. Only a character split by a block's
    edge can decode differently from the raw text (as one replacement character).
    """
    predicted = blocks[:, 1:]
    is_eos = predicted == tokenizer.eos_token_id
    texts = tokenizer.backend_tokenizer.decode_batch(
        [row[~eos].tolist() for row, eos in zip(predicted, is_eos, strict=True)],
        skip_special_tokens=False,
    )
    return sum(len(text.encode()) for text in texts) + int(is_eos.sum())


def unigram_entropy(token_ids: np.ndarray, vocab_size: int) -> float:
    """Entropy in nats of the token frequencies: the cross-entropy floor of a context-free model."""
    counts = np.bincount(token_ids, minlength=vocab_size)
    probabilities = counts[counts > 0] / len(token_ids)
    return float(-(probabilities * np.log(probabilities)).sum())


def blocks_dataset(blocks: np.ndarray) -> datasets.Dataset:
    """A Dataset of one fixed-length int32 column `input_ids` from a [num_blocks, block_size]
    array, without a round trip through Python lists."""
    block_size = blocks.shape[1]
    flat = pa.array(np.ascontiguousarray(blocks, dtype=np.int32).reshape(-1))
    features = datasets.Features(
        {"input_ids": datasets.List(datasets.Value("int32"), length=block_size)}
    )
    return datasets.Dataset.from_dict(
        {"input_ids": pa.FixedSizeListArray.from_arrays(flat, block_size)}, features=features
    )
