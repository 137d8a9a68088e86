"""Packed-block preparation: our pipeline vs the `run_clm.py` recipe, side by side in one run.

    python bench/prepare.py                      # synthetic WoS-sized corpus (60 MB), 3 repeats
    python bench/prepare.py --corpus data/WebOfScience.zip --tokenizer_dir runs/tokenizer

Both start from the corpus path and end with blocks saved by `save_to_disk`, read with the same
reader and the same tokenizer:
- ours: `pretrain.blocks.cache.prepare_blocks` (fresh cache folder each time);
- the recipe users copy from transformers' `examples/pytorch/language-modeling/run_clm.py`:
  `train_test_split`, `map(tokenize_function, batched=True)`, then `map(group_texts,
  batched=True)`, which concatenates Python lists per map batch, drops a remainder per batch
  and stores `labels` as a copy of `input_ids` (it also adds no end-of-text between documents).

The two alternate within each repeat (order swapped every repeat) after a warm-up on a small
slice, and the ratio is taken per repeat, because the machine is shared and absolute times
drift. Each repeat also times the tokenizer alone (`encode_batch_fast` over all documents, no
pipeline): the floor any pipeline with this tokenizer pays. Without `--corpus` the corpus is
synthesised like `bench/train_tokenizer.py` does (60 MB of WoS-length abstracts recombined
from the demo text; not the real data), and without `--tokenizer_dir` a byte-level BPE is
trained on its first `--tokenizer_training_mb` MB with `tokenizer.train`.
"""

from __future__ import annotations

import json
import logging
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import datasets  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from train_tokenizer import synthesize_wos_corpus  # noqa: E402  (bench/ is the script folder)

from common.cli import entry_point, parse_args  # noqa: E402
from common.corpus import CorpusArguments, iter_documents  # noqa: E402
from common.system import hardware_description, library_versions  # noqa: E402
from common.tokenization import load_tokenizer  # noqa: E402
from pretrain.blocks.args import DataArguments  # noqa: E402
from pretrain.blocks.cache import prepare_blocks, read_stats  # noqa: E402
from tokenizer.train import TokenizerArguments, train_tokenizer  # noqa: E402

logger = logging.getLogger(__name__)

WARMUP_DOCUMENTS = 2000
# datasets' default map batch size, used by both pipelines.
MAP_BATCH_SIZE = 1000


@dataclass
class BenchArguments:
    corpus: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Corpus to time (any input the corpus reader takes); default: a synthetic "
            "WoS-sized corpus."
        },
    )
    tokenizer_dir: str | None = field(
        default=None,
        metadata={"help": "Tokenizer folder to use; default: train one on the corpus's start."},
    )
    synthetic_mb: float = field(
        default=60.0, metadata={"help": "Size of the synthetic corpus in MB (1e6 bytes)."}
    )
    tokenizer_vocab_size: int = field(
        default=32768, metadata={"help": "Vocabulary of the tokenizer trained when none is given."}
    )
    tokenizer_training_mb: float = field(
        default=10.0, metadata={"help": "MB of the corpus the default tokenizer is trained on."}
    )
    block_size: int = field(default=1024, metadata={"help": "Tokens per block."})
    validation_fraction: float = field(
        default=0.005, metadata={"help": "Share of documents held out, in both pipelines."}
    )
    num_proc: int | None = field(
        default=None, metadata={"help": "map num_proc, the same for both pipelines."}
    )
    repeats: int = field(default=3, metadata={"help": "Side-by-side repeats."})
    output_json: str | None = field(
        default=None, metadata={"help": "Also write the results to this JSON file."}
    )


def run_clm_recipe(
    corpus: list[str],
    tokenizer_dir: str,
    output_dir: Path,
    block_size: int,
    validation_fraction: float,
    num_proc: int | None,
) -> dict[str, Any]:
    """The tokenize + group_texts recipe of transformers' run_clm.py, from corpus to disk."""
    stage_started = time.perf_counter()
    stage_seconds = {}
    tokenizer = load_tokenizer(tokenizer_dir)
    documents = list(iter_documents(CorpusArguments(corpus=corpus)))
    stage_seconds["read"] = time.perf_counter() - stage_started
    stage_started = time.perf_counter()
    raw = datasets.Dataset.from_dict({"text": documents})
    raw = raw.train_test_split(test_size=validation_fraction, seed=0)
    raw = datasets.DatasetDict(train=raw["train"], validation=raw["test"])

    def tokenize_function(examples):
        return tokenizer(examples["text"])

    tokenized = raw.map(tokenize_function, batched=True, num_proc=num_proc, remove_columns=["text"])
    stage_seconds["tokenize"] = time.perf_counter() - stage_started
    stage_started = time.perf_counter()

    def group_texts(examples):
        # Concatenate all texts.
        concatenated_examples = {k: list(chain(*examples[k])) for k in examples}
        total_length = len(concatenated_examples[list(examples.keys())[0]])
        # We drop the small remainder.
        total_length = (total_length // block_size) * block_size
        # Split by chunks of max_len.
        result = {
            k: [t[i : i + block_size] for i in range(0, total_length, block_size)]
            for k, t in concatenated_examples.items()
        }
        result["labels"] = result["input_ids"].copy()
        return result

    lm_datasets = tokenized.map(group_texts, batched=True, num_proc=num_proc)
    stage_seconds["pack"] = time.perf_counter() - stage_started
    stage_started = time.perf_counter()
    lm_datasets.save_to_disk(str(output_dir))
    stage_seconds["save"] = time.perf_counter() - stage_started
    num_tokens = sum(
        pc.sum(pc.list_value_length(split.data.column("input_ids"))).as_py()
        for split in tokenized.values()
    )
    num_blocks = sum(len(split) for split in lm_datasets.values())
    return {
        "num_blocks": num_blocks,
        "num_tokens": num_tokens,
        "num_dropped_tokens": num_tokens - num_blocks * block_size,
        "stage_seconds": {name: round(value, 3) for name, value in stage_seconds.items()},
    }


def run_ours(
    corpus: list[str],
    tokenizer_dir: str,
    cache_dir: Path,
    block_size: int,
    validation_fraction: float,
    num_proc: int | None,
) -> dict[str, Any]:
    """`prepare_blocks` into an empty cache folder, then once more to time the reuse."""
    corpus_args = CorpusArguments(corpus=corpus)
    data_args = DataArguments(
        tokenizer_dir=tokenizer_dir,
        cache_dir=str(cache_dir),
        block_size=block_size,
        n_positions=max(1024, block_size),
        validation_fraction=validation_fraction,
        num_proc=num_proc,
    )
    folder = prepare_blocks(corpus_args, data_args)
    started = time.perf_counter()
    prepare_blocks(corpus_args, data_args)
    reuse_seconds = time.perf_counter() - started
    stats = read_stats(folder)
    splits = stats["splits"].values()
    return {
        "num_blocks": sum(split["num_blocks"] for split in splits),
        "num_tokens": stats["num_tokens"],
        "num_bytes": stats["num_bytes"],
        "num_documents": stats["num_documents"],
        "num_dropped_tokens": sum(split["num_dropped_tokens"] for split in splits),
        "reuse_seconds_excluded": round(reuse_seconds, 3),
        "stage_seconds": stats["seconds"],
    }


def tokenize_only(corpus: list[str], tokenizer_dir: str) -> dict[str, Any]:
    """The tokenizer alone over every document, in the map's batches of 1,000 documents (one
    call for the whole corpus is slower): the cost no pipeline with this tokenizer avoids."""
    backend = load_tokenizer(tokenizer_dir).backend_tokenizer
    documents = list(iter_documents(CorpusArguments(corpus=corpus)))
    started = time.perf_counter()
    num_tokens = 0
    for start in range(0, len(documents), MAP_BATCH_SIZE):
        batch = documents[start : start + MAP_BATCH_SIZE]
        num_tokens += sum(map(len, backend.encode_batch_fast(batch, add_special_tokens=False)))
    seconds = time.perf_counter() - started
    return {"tokenizer_seconds": round(seconds, 3), "num_tokens": num_tokens}


def timed(function: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run `function`; add wall seconds and CPU seconds (all threads, and child processes)."""

    def cpu_seconds() -> float:
        usages = [
            resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        ]
        return sum(usage.ru_utime + usage.ru_stime for usage in usages)

    cpu_started = cpu_seconds()
    started = time.perf_counter()
    result = function()
    result["wall_seconds"] = round(time.perf_counter() - started, 3)
    result["cpu_seconds"] = round(cpu_seconds() - cpu_started, 3)
    # The reuse call inside run_ours is not part of the build time.
    result["wall_seconds"] -= result.get("reuse_seconds_excluded", 0.0)
    return result


def write_corpus_slice(corpus: list[str], path: Path, max_documents: int | None, max_mb: float):
    """The first documents of the corpus (up to either limit) as a one-document-per-line file."""
    written = 0
    with path.open("w", encoding="utf-8") as handle:
        for index, document in enumerate(iter_documents(CorpusArguments(corpus=corpus))):
            if (max_documents is not None and index >= max_documents) or written >= max_mb * 1e6:
                break
            handle.write(document + "\n")
            written += len(document.encode("utf-8")) + 1
    return path


def compare(args: BenchArguments, corpus: list[str], tokenizer_dir: str, work_dir: Path):
    settings = (args.block_size, args.validation_fraction, args.num_proc)
    warmup_corpus = [
        str(write_corpus_slice(corpus, work_dir / "warmup.txt", WARMUP_DOCUMENTS, 1e9))
    ]
    run_ours(warmup_corpus, tokenizer_dir, work_dir / "warmup_ours", *settings)
    run_clm_recipe(warmup_corpus, tokenizer_dir, work_dir / "warmup_recipe", *settings)
    repeats = []
    for repeat in range(args.repeats):
        contenders = {
            "ours": lambda r=repeat: run_ours(
                corpus, tokenizer_dir, work_dir / f"ours{r}", *settings
            ),
            "run_clm_recipe": lambda r=repeat: run_clm_recipe(
                corpus, tokenizer_dir, work_dir / f"recipe{r}", *settings
            ),
        }
        order = list(contenders) if repeat % 2 == 0 else list(contenders)[::-1]
        results = {name: timed(contenders[name]) for name in order}
        results["tokenizer_only"] = timed(lambda: tokenize_only(corpus, tokenizer_dir))
        for measure in ("wall_seconds", "cpu_seconds"):
            results[f"recipe_over_ours_{measure}"] = round(
                results["run_clm_recipe"][measure] / results["ours"][measure], 2
            )
        logger.info("repeat %d: %s", repeat, json.dumps(results))
        repeats.append(results)
    return repeats


def summarize(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    def walls(name: str) -> list[float]:
        return [repeat[name]["wall_seconds"] for repeat in repeats]

    def after_tokenization(result: dict[str, Any]) -> float:
        return result["stage_seconds"]["pack"] + result["stage_seconds"]["save"]

    ours, recipe = repeats[0]["ours"], repeats[0]["run_clm_recipe"]
    tokenizer_floor = statistics.median(walls("tokenizer_only"))
    return {
        "median_ratio_recipe_over_ours_cpu": statistics.median(
            r["recipe_over_ours_cpu_seconds"] for r in repeats
        ),
        "ratios_recipe_over_ours_cpu": [r["recipe_over_ours_cpu_seconds"] for r in repeats],
        "median_ratio_recipe_over_ours_wall": statistics.median(
            r["recipe_over_ours_wall_seconds"] for r in repeats
        ),
        "ratios_recipe_over_ours_wall": [r["recipe_over_ours_wall_seconds"] for r in repeats],
        "median_ratio_pack_and_save_recipe_over_ours_wall": round(
            statistics.median(
                after_tokenization(r["run_clm_recipe"]) / after_tokenization(r["ours"])
                for r in repeats
            ),
            2,
        ),
        "ours_best_seconds": min(walls("ours")),
        "ours_median_seconds": statistics.median(walls("ours")),
        "recipe_best_seconds": min(walls("run_clm_recipe")),
        "recipe_median_seconds": statistics.median(walls("run_clm_recipe")),
        "tokenizer_only_median_seconds": tokenizer_floor,
        "ours_median_over_tokenizer_only": round(
            statistics.median(walls("ours")) / tokenizer_floor, 2
        ),
        "recipe_median_over_tokenizer_only": round(
            statistics.median(walls("run_clm_recipe")) / tokenizer_floor, 2
        ),
        "ours_cpu_seconds_median": statistics.median(r["ours"]["cpu_seconds"] for r in repeats),
        "recipe_cpu_seconds_median": statistics.median(
            r["run_clm_recipe"]["cpu_seconds"] for r in repeats
        ),
        "tokenizer_only_cpu_seconds_median": statistics.median(
            r["tokenizer_only"]["cpu_seconds"] for r in repeats
        ),
        "ours_reuse_seconds": min(r["ours"]["reuse_seconds_excluded"] for r in repeats),
        "ours_blocks": ours["num_blocks"],
        "ours_dropped_tokens": ours["num_dropped_tokens"],
        "recipe_blocks": recipe["num_blocks"],
        "recipe_dropped_tokens": recipe["num_dropped_tokens"],
    }


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args([BenchArguments], argv, description=__doc__, prog="bench/prepare.py")
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        work_dir = Path(tmp)
        corpus = args.corpus
        if not corpus:
            size_bytes = int(args.synthetic_mb * 1e6)
            corpus = [str(synthesize_wos_corpus(work_dir / "corpus", size_bytes))]
        tokenizer_dir = args.tokenizer_dir
        if tokenizer_dir is None:
            training_slice = write_corpus_slice(
                corpus, work_dir / "tokenizer_text.txt", None, args.tokenizer_training_mb
            )
            tokenizer_dir = str(work_dir / "tokenizer")
            train_tokenizer(
                CorpusArguments(corpus=[str(training_slice)]),
                TokenizerArguments(output_dir=tokenizer_dir, vocab_size=args.tokenizer_vocab_size),
                show_progress=False,
            )
        vocab_size = len(load_tokenizer(tokenizer_dir))
        repeats = compare(args, corpus, tokenizer_dir, work_dir)
    result = {
        "corpus": args.corpus or f"synthetic WoS-sized corpus ({args.synthetic_mb} MB)",
        "corpus_mb": round(repeats[0]["ours"]["num_bytes"] / 1e6, 1),
        "num_documents": repeats[0]["ours"]["num_documents"],
        "vocab_size": vocab_size,
        "summary": summarize(repeats),
        "repeats": repeats,
        "config": asdict(args),
        "hardware": hardware_description(),
        "versions": library_versions(),
    }
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"vocab_size": vocab_size, **result["summary"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
