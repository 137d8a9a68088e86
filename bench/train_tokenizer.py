"""Tokenizer training speed on a Web-of-Science-sized corpus (target: the full WoS in <= 60 s).

    python bench/train_tokenizer.py                      # synthetic 60 MB corpus, 3 repeats
    python bench/train_tokenizer.py --corpus data/WebOfScience.zip

Runs the real `train_tokenizer` path (reading pass, streaming BPE training, held-out stats,
saving) several times and reports the best and median, because the machine is shared and
single runs are noisy. Without `--corpus`, a corpus of the size and document length of
WOS46985 (60 MB, ~1,270 bytes per abstract) is synthesised deterministically from the demo
text: sentences recombined into abstracts, with invented compound words so that the number of
distinct words is in the range estimated for real abstracts (~10^5, Heaps' law on ~9M words)
rather than the demo's few thousand. It is not the real data: timings on the real download
may differ. CPU seconds (all threads) are reported beside wall time: they are less disturbed
by other jobs on the machine, and CPU seconds / 2 bounds the wall time on 2 idle cores from
below.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import entry_point, parse_args  # noqa: E402
from common.corpus import WOS_TEXT_FILE, CorpusArguments  # noqa: E402
from common.demo_corpus import demo_documents  # noqa: E402
from common.system import hardware_description, library_versions  # noqa: E402
from tokenizer.train import TokenizerArguments, train_tokenizer  # noqa: E402

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
    corpus: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Real corpus to time (any input train-tokenizer takes); default: "
            "a synthetic WoS-sized corpus."
        },
    )
    synthetic_mb: float = field(
        default=60.0, metadata={"help": "Size of the synthetic corpus in MB (1e6 bytes)."}
    )
    vocab_size: int = field(default=32768, metadata={"help": "Vocabulary size to train."})
    repeats: int = field(default=3, metadata={"help": "Training runs; best and median reported."})
    output_json: str | None = field(
        default=None, metadata={"help": "Also write the results to this JSON file."}
    )


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
) -> list[dict[str, float]]:
    runs = []
    tokenizer_files = set()
    for repeat in range(repeats):
        output_dir = work_dir / f"run{repeat}"
        started = time.perf_counter()
        cpu_started = time.process_time()
        stats = train_tokenizer(
            CorpusArguments(corpus=corpus),
            TokenizerArguments(output_dir=str(output_dir), vocab_size=vocab_size),
            show_progress=False,
        )
        runs.append(
            {
                "wall_seconds": round(time.perf_counter() - started, 2),
                "cpu_seconds": round(time.process_time() - cpu_started, 2),
                "reading_seconds": stats["reading_seconds"],
                "training_seconds": stats["training_seconds"],
                "training_mb_per_second": stats["training_mb_per_second"],
                "num_bytes": stats["num_bytes"],
                "num_documents": stats["num_documents"],
                "heldout_bytes_per_token": stats["heldout"]["bytes_per_token"],
            }
        )
        tokenizer_files.add((output_dir / "tokenizer.json").read_bytes())
        logger.info("run %d: %s", repeat, runs[-1])
    if len(tokenizer_files) != 1:
        raise RuntimeError("repeated runs gave different tokenizer.json files")
    return runs


def summarize(runs: list[dict[str, float]]) -> dict[str, float]:
    walls = [run["wall_seconds"] for run in runs]
    trainings = [run["training_seconds"] for run in runs]
    num_mb = runs[0]["num_bytes"] / 1e6
    return {
        "corpus_mb": round(num_mb, 1),
        "num_documents": runs[0]["num_documents"],
        "best_wall_seconds": min(walls),
        "median_wall_seconds": statistics.median(walls),
        "best_training_seconds": min(trainings),
        "median_training_seconds": statistics.median(trainings),
        "best_mb_per_second": round(num_mb / min(trainings), 2),
        "median_mb_per_second": round(num_mb / statistics.median(trainings), 2),
        "median_cpu_seconds": statistics.median(run["cpu_seconds"] for run in runs),
        "heldout_bytes_per_token": round(runs[0]["heldout_bytes_per_token"], 3),
    }


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args(
        [BenchArguments], argv, description=__doc__, prog="python bench/train_tokenizer.py"
    )
    with tempfile.TemporaryDirectory(prefix="bench-tokenizer-") as tmp:
        work_dir = Path(tmp)
        corpus = args.corpus
        if not corpus:
            started = time.perf_counter()
            size_bytes = int(args.synthetic_mb * 1e6)
            corpus = [str(synthesize_wos_corpus(work_dir / "corpus", size_bytes))]
            logger.info("synthesised the corpus in %.1f s", time.perf_counter() - started)
        runs = time_training(corpus, args.vocab_size, args.repeats, work_dir)
    result = {
        "corpus": args.corpus or f"synthetic WoS-sized corpus ({args.synthetic_mb} MB)",
        "vocab_size": args.vocab_size,
        "summary": summarize(runs),
        "runs": runs,
        "config": asdict(args),
        "hardware": hardware_description(),
        "versions": library_versions(),
    }
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
