"""`train-tokenizer`: learn a byte-level BPE vocabulary from a corpus, save it for transformers.

    train-tokenizer --corpus data/WebOfScience.zip --output_dir runs/tokenizer

The output folder loads with `AutoTokenizer.from_pretrained(output_dir)` (offline) and holds
`stats.json`: corpus counts, training time, and bytes per token / tokens per word measured on
held-out documents (every `heldout_every`-th document is left out of training).
"""

import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from transformers.hf_argparser import HfArg

from common.cli import entry_point, parse_args
from common.corpus import CorpusArguments, CorpusStats, iter_documents
from common.files import atomic_dir, write_json_atomic
from common.system import hardware_description, library_versions
from common.values import NOT_NEGATIVE, Range, at_least
from tokenizer.bpe import MIN_VOCAB_SIZE, measure_compression, train_bpe, wrap_for_transformers

logger = logging.getLogger(__name__)

STATS_FILE = "stats.json"


@dataclass
class TokenizerArguments:
    """What to learn and where to save it."""

    output_dir: str = HfArg(
        help="Folder to create for the tokenizer (refused if it exists: --overwrite)."
    )
    vocab_size: int = HfArg(
        default=32768,
        help=f"Vocabulary size including the 256 bytes and 2 special tokens (at least "
        f"{MIN_VOCAB_SIZE}). A multiple of 128 keeps the model's embedding matmuls efficient.",
        metadata={"range": at_least(MIN_VOCAB_SIZE)},
    )
    min_frequency: int = HfArg(
        default=2,
        help="A pair must occur this often in the corpus to be merged.",
        metadata={"range": NOT_NEGATIVE},
    )
    heldout_every: int = HfArg(
        default=100,
        help="Leave every N-th document out of training and measure bytes per token and "
        "tokens per word on those (0: use no held-out documents).",
        metadata={"range": Range(lambda every: every == 0 or every >= 2, "0 or at least 2")},
    )
    batch_size: int = HfArg(
        default=1000,
        help="Documents handed to the tokenizers library per batch.",
        metadata={"range": at_least(1)},
    )
    model_max_length: int = HfArg(
        default=1024,
        help="Context length recorded in the saved tokenizer.",
        metadata={"range": at_least(1)},
    )
    overwrite: bool = HfArg(default=False, help="Replace output_dir if it already exists.")


def train_tokenizer(
    corpus_args: CorpusArguments, tokenizer_args: TokenizerArguments, show_progress: bool = True
) -> dict[str, Any]:
    """Train on the corpus and save the tokenizer folder, which appears only when everything
    succeeded (an existing one is refused up front); return what went into stats.json."""
    with atomic_dir(tokenizer_args.output_dir, overwrite=tokenizer_args.overwrite) as folder:
        # A first pass checks every line before any training and sizes the progress bar.
        started = time.perf_counter()
        corpus_stats = CorpusStats()
        num_documents = sum(1 for _ in iter_documents(corpus_args, corpus_stats))
        reading_seconds = time.perf_counter() - started
        every = tokenizer_args.heldout_every
        num_heldout = num_documents // every if every else 0
        logger.info(
            "training on %d documents (%d held out), vocabulary %d",
            num_documents - num_heldout,
            num_heldout,
            tokenizer_args.vocab_size,
        )

        heldout: list[str] = []

        def training_documents() -> Iterator[str]:
            for index, document in enumerate(iter_documents(corpus_args, log=False), start=1):
                # Every `every`-th document is kept out of training: a fixed, spread-out slice.
                if every and index % every == 0:
                    heldout.append(document)
                else:
                    yield document

        started = time.perf_counter()
        tokenizer = train_bpe(
            training_documents(),
            vocab_size=tokenizer_args.vocab_size,
            num_documents=num_documents - num_heldout,
            min_frequency=tokenizer_args.min_frequency,
            batch_size=tokenizer_args.batch_size,
            show_progress=show_progress,
        )
        training_seconds = time.perf_counter() - started

        compression = measure_compression(tokenizer, heldout)
        if compression is None:
            logger.warning(
                "no held-out documents: bytes per token and tokens per word not measured"
            )
        # Both passes read the same documents: the training ones are all but the held-out.
        training_bytes = corpus_stats.num_bytes - (compression or {}).get("num_bytes", 0)
        stats = {
            **dataclasses.asdict(corpus_stats),
            "num_training_documents": num_documents - num_heldout,
            "num_training_bytes": training_bytes,
            "reading_seconds": round(reading_seconds, 3),
            "training_seconds": round(training_seconds, 3),
            "training_mb_per_second": round(training_bytes / 1e6 / training_seconds, 3),
            "vocab_size": tokenizer.get_vocab_size(),
            "requested_vocab_size": tokenizer_args.vocab_size,
            "heldout": compression,
            "config": {
                "corpus": dataclasses.asdict(corpus_args),
                "tokenizer": dataclasses.asdict(tokenizer_args),
            },
            "versions": library_versions(),
            "hardware": hardware_description(),
        }
        wrap_for_transformers(tokenizer, tokenizer_args.model_max_length).save_pretrained(folder)
        write_json_atomic(folder / STATS_FILE, stats)
    logger.info(
        "vocabulary of %d tokens in %.1f s (%.2f MB/s); held-out bytes per token %s",
        stats["vocab_size"],
        stats["training_seconds"],
        stats["training_mb_per_second"],
        "n/a" if stats["heldout"] is None else f"{stats['heldout']['bytes_per_token']:.2f}",
    )
    return stats


@entry_point
def main(argv: list[str] | None = None) -> int:
    corpus_args, tokenizer_args = parse_args(
        [CorpusArguments, TokenizerArguments], argv, description=__doc__, prog="train-tokenizer"
    )
    train_tokenizer(corpus_args, tokenizer_args)
    print(tokenizer_args.output_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
