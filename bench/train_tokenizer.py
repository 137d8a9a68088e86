"""Tokenizer training speed on a Web-of-Science-sized corpus (target: the full WoS in <= 60 s).

    python -m bench.train_tokenizer                      # synthetic 60 MB corpus, 3 repeats
    python -m bench.train_tokenizer --corpus data/WebOfScience.zip

Runs the real `train_tokenizer` path (reading, streaming BPE training, held-out stats, saving)
several times; best and median, because single runs on a shared machine are noisy. Without
`--corpus`, a corpus of WOS46985's size and document length (60 MB, ~1,270 bytes per abstract)
is synthesised deterministically from the demo text: sentences recombined into abstracts, with
invented compound words so that the distinct words number ~10^5 as estimated for real
abstracts (Heaps' law on ~9M words). CPU seconds (all threads), beside wall time, are less
disturbed by other jobs; CPU seconds / 2 bounds the wall time on 2 idle cores from below.
"""

from __future__ import annotations

import itertools
import logging
import random
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from transformers.hf_argparser import HfArg

from common.cli import entry_point, parse_args
from common.corpus import WOS_TEXT_FILE, CorpusArguments
from common.demo_corpus import demo_documents
from report.tables import markdown_table
from tokenizer.train import TokenizerArguments, train_tokenizer

logger = logging.getLogger(__name__)

# WOS46985/X.txt: 46,985 abstracts in about 60 MB.
WOS_MEAN_DOCUMENT_BYTES = 1270
# Invented technical terms (two demo words glued together), drawn with Zipf frequencies like
# real vocabulary: a few common, a long tail seen once or twice. Terms replace words in every
# sentence (~400k sentences in 60 MB), giving ~10^5 distinct words like real abstracts.
NUM_INVENTED_TERMS = 1_000_000
INVENTED_TERMS_PER_SENTENCE = 2


@dataclass
class BenchArguments:
    corpus: list[str] = HfArg(
        default_factory=list,
        help="Real corpus to time (any input train-tokenizer takes); default: "
        "a synthetic WoS-sized corpus.",
    )
    synthetic_mb: float = HfArg(
        default=60.0, help="Size of the synthetic corpus in MB (1e6 bytes)."
    )
    vocab_size: int = HfArg(default=32768, help="Vocabulary size to train.")
    repeats: int = HfArg(default=3, help="Training runs; best and median reported.")


def synthesize_wos_corpus(folder: Path, size_bytes: int, seed: int = 0) -> Path:
    """Write `<folder>/WOS46985/X.txt` of about `size_bytes` of abstract-like lines."""
    text = " ".join(demo_documents())
    sentences = re.split(r"(?<=[.!?])\s+", text)
    words = sorted(set(re.findall(r"\b[a-z]{3,}\b", text)))
    rng = random.Random(seed)
    terms = [rng.choice(words) + rng.choice(words) for _ in range(NUM_INVENTED_TERMS)]
    zipf_cumulative_weights = list(
        itertools.accumulate(1 / rank for rank in range(1, len(terms) + 1))
    )
    path = folder / "WOS46985" / WOS_TEXT_FILE
    path.parent.mkdir(parents=True)
    written = 0
    with path.open("w", encoding="utf-8") as handle:
        while written < size_bytes:
            target = max(200, int(rng.gauss(WOS_MEAN_DOCUMENT_BYTES, 400)))
            parts: list[str] = []
            length = 0
            while length < target:
                tokens = rng.choice(sentences).split()
                invented = rng.choices(
                    terms, cum_weights=zipf_cumulative_weights, k=INVENTED_TERMS_PER_SENTENCE
                )
                for term in invented:
                    tokens[rng.randrange(len(tokens))] = term
                sentence = " ".join(tokens)
                parts.append(sentence)
                length += len(sentence) + 1
            line = " ".join(parts) + "\n"
            handle.write(line)
            written += len(line.encode("utf-8"))
    return folder


def time_training(
    corpus: list[str], vocab_size: int, repeats: int, work_dir: Path
) -> tuple[dict[str, list[float]], dict]:
    """Each measure of every repeat, and the stats of the last one; the repeats must save the
    same tokenizer.json."""
    measures: dict[str, list[float]] = {}
    tokenizer_files = set()
    for repeat in range(repeats):
        output_dir = work_dir / f"run{repeat}"
        started, cpu_started = time.perf_counter(), time.process_time()
        stats = train_tokenizer(
            CorpusArguments(corpus=corpus),
            TokenizerArguments(output_dir=str(output_dir), vocab_size=vocab_size),
            show_progress=False,
        )
        run = {
            "training seconds": stats["training_seconds"],
            "throughput (MB/s)": stats["num_bytes"] / 1e6 / stats["training_seconds"],
            "train_tokenizer(), wall seconds": time.perf_counter() - started,
            "CPU seconds (all threads)": time.process_time() - cpu_started,
        }
        for name, value in run.items():
            measures.setdefault(name, []).append(value)
        tokenizer_files.add((output_dir / "tokenizer.json").read_bytes())
        logger.info("run %d: %s", repeat, run)
    if len(tokenizer_files) != 1:
        raise RuntimeError("repeated runs gave different tokenizer.json files")
    return measures, stats


@entry_point
def main(argv: list[str] | None = None) -> int:
    prog = "python -m bench.train_tokenizer"
    (args,) = parse_args([BenchArguments], argv, description=__doc__, prog=prog)
    with tempfile.TemporaryDirectory(prefix="bench-tokenizer-") as tmp:
        corpus = args.corpus
        if not corpus:
            size_bytes = int(args.synthetic_mb * 1e6)
            corpus = [str(synthesize_wos_corpus(Path(tmp, "corpus"), size_bytes))]
        measures, stats = time_training(corpus, args.vocab_size, args.repeats, Path(tmp))
    print(
        f"{stats['num_bytes'] / 1e6:.1f} MB, {stats['num_documents']:,} documents, vocabulary "
        f"{args.vocab_size:,}: held-out bytes per token {stats['heldout']['bytes_per_token']:.2f}"
    )
    rows = [
        [name, f"{(max if 'MB/s' in name else min)(values):.2f}", f"{median(values):.2f}"]
        for name, values in measures.items()
    ]
    print("\n".join(markdown_table(["", "best", f"median of {args.repeats}"], rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
