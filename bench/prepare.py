"""Packed-block preparation side by side: time, CPU and peak memory of `prepare-blocks` against
an earlier commit's code, the `run_clm.py` recipe and the tokenizer alone, at several sizes.

    python -m bench.prepare --sizes_mb 20 200 2000 --tokenizer_vocab_size 8192  # before, after
    python -m bench.prepare --sizes_mb 60 --contenders after recipe tokenizer --repeats 3
    python -m bench.prepare --corpus data/WebOfScience.zip --tokenizer_dir runs/tokenizer

Each contender is a child process from the corpus path to blocks on disk, measured by the
kernel (`wait4`: wall seconds, CPU seconds of all threads, peak resident memory):
- after: `prepare-blocks` of this checkout, into a fresh cache folder;
- before: `prepare-blocks` of `--baseline_commit` (exported with `git archive`); its blocks
  (every split's token ids, in order) and document split must be identical to after's;
- recipe: transformers' `examples/pytorch/language-modeling/run_clm.py`: `train_test_split`,
  `map(tokenize_function)`, then `map(group_texts)`, which concatenates Python lists per map
  batch, drops a remainder per batch, copies `input_ids` as `labels` and adds no end-of-text;
- tokenizer: `encode_batch_fast` over all documents in batches of 1,000, nothing kept: the
  floor of any pipeline with this tokenizer.
`before` and `recipe` hold the corpus and its tokens in memory: skipped above
`--in_memory_max_mb`. Contenders alternate within each repeat (order reversed every other
repeat) after a warm-up on 2,000 documents: the machine is shared and absolute times drift.
Without `--corpus` each size is synthesised like bench.train_tokenizer does (WoS-length
abstracts recombined from the demo text; not the real data); without `--tokenizer_dir` a
byte-level BPE is trained on the first `--tokenizer_training_mb` MB.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
from transformers.hf_argparser import HfArg

from bench.train_tokenizer import synthesize_wos_corpus
from bench.variants import REPO_ROOT
from common.cli import RunFailed, entry_point, parse_args
from common.corpus import CorpusArguments, iter_documents
from common.run_contract import DOCUMENT_SPLIT_FILE
from common.system import hardware_description, library_versions
from common.tokenization import load_tokenizer
from pretrain.blocks.cache import read_stats
from pretrain.blocks.packing import SPLITS
from report.tables import markdown_table
from tokenizer.train import TokenizerArguments, train_tokenizer

logger = logging.getLogger(__name__)

CONTENDERS = ("before", "after", "recipe", "tokenizer")
WARMUP_DOCUMENTS = 2000
# datasets' default map batch size, used by the recipe and the tokenizer alone.
MAP_BATCH_SIZE = 1000


@dataclass
class BenchArguments:
    corpus: list[str] = HfArg(
        default_factory=list,
        help="Corpus to time (any input the corpus reader takes); default: synthetic.",
    )
    sizes_mb: list[float] = HfArg(
        default_factory=lambda: [60.0],
        help="Sizes of the synthetic corpora in MB (1e6 bytes), one run each.",
    )
    contenders: list[str] = HfArg(
        default_factory=lambda: ["before", "after"],
        help="Which pipelines to time.",
        metadata={"choices": CONTENDERS},
    )
    baseline_commit: str = HfArg(
        default="861b422", help="The commit whose code is the `before` contender."
    )
    in_memory_max_mb: float = HfArg(
        default=250.0,
        help="Largest corpus (MB; a --corpus: its files on disk) for `before` and `recipe`, "
        "which hold it in memory.",
    )
    tokenizer_dir: str | None = HfArg(
        default=None, help="Tokenizer folder to use; default: train one on the corpus's start."
    )
    tokenizer_vocab_size: int = HfArg(
        default=32768, help="Vocabulary of the tokenizer trained when none is given."
    )
    tokenizer_training_mb: float = HfArg(
        default=10.0, help="MB of the corpus the default tokenizer is trained on."
    )
    block_size: int = HfArg(default=1024, help="Tokens per block.")
    validation_fraction: float = HfArg(
        default=0.005, help="Share of documents held out, in every pipeline."
    )
    repeats: int = HfArg(default=1, help="Side-by-side repeats per size.")
    output_json: str | None = HfArg(default=None, help="Also write the results to this JSON file.")
    child: str | None = HfArg(
        default=None, help="Internal: run this contender here and print its result as JSON."
    )
    output_dir: str | None = HfArg(default=None, help="Internal: the child's output.")


def run_clm_recipe(args: BenchArguments) -> dict[str, Any]:
    """The tokenize + group_texts recipe of transformers' run_clm.py, from corpus to disk."""
    tokenizer = load_tokenizer(args.tokenizer_dir)
    documents = list(iter_documents(CorpusArguments(corpus=args.corpus)))
    raw = datasets.Dataset.from_dict({"text": documents})
    raw = raw.train_test_split(test_size=args.validation_fraction, seed=0)
    raw = datasets.DatasetDict(train=raw["train"], validation=raw["test"])

    def tokenize_function(examples):
        return tokenizer(examples["text"])

    tokenized = raw.map(tokenize_function, batched=True, remove_columns=["text"])
    block_size = args.block_size

    def group_texts(examples):
        concatenated_examples = {k: list(chain(*examples[k])) for k in examples}
        total_length = len(concatenated_examples[list(examples.keys())[0]])
        total_length = (total_length // block_size) * block_size
        result = {
            k: [t[i : i + block_size] for i in range(0, total_length, block_size)]
            for k, t in concatenated_examples.items()
        }
        result["labels"] = result["input_ids"].copy()
        return result

    lm_datasets = tokenized.map(group_texts, batched=True)
    lm_datasets.save_to_disk(args.output_dir)
    num_tokens = sum(
        pc.sum(pc.list_value_length(split.data.column("input_ids"))).as_py()
        for split in tokenized.values()
    )
    num_blocks = sum(len(split) for split in lm_datasets.values())
    return {"num_blocks": num_blocks, "num_dropped_tokens": num_tokens - num_blocks * block_size}


def tokenize_only(args: BenchArguments) -> dict[str, Any]:
    """The tokenizer alone over every document, in the map's batches of 1,000 documents (one
    call for the whole corpus is slower): the cost no pipeline with this tokenizer avoids."""
    backend = load_tokenizer(args.tokenizer_dir).backend_tokenizer
    documents = list(iter_documents(CorpusArguments(corpus=args.corpus)))
    num_tokens = 0
    for start in range(0, len(documents), MAP_BATCH_SIZE):
        batch = documents[start : start + MAP_BATCH_SIZE]
        num_tokens += sum(map(len, backend.encode_batch_fast(batch, add_special_tokens=False)))
    return {"num_tokens": num_tokens}


def measure(name: str, corpus: list[str], args: BenchArguments, output_dir: Path, roots) -> dict:
    """Run one contender as a child process; its result, wall and CPU seconds and peak RSS."""
    settings = ["--corpus", *corpus, "--tokenizer_dir", args.tokenizer_dir,
                "--block_size", str(args.block_size),
                "--validation_fraction", str(args.validation_fraction)]  # fmt: skip
    if name in ("before", "after"):
        command = [sys.executable, "-m", "pretrain.blocks.prepare", *settings]
        command += ["--cache_dir", str(output_dir)]
    else:
        command = [sys.executable, "-m", "bench.prepare", "--child", name, *settings]
        command += ["--output_dir", str(output_dir)]
    root = roots.get(name, REPO_ROOT)  # `python -m` puts the working folder first on sys.path
    env = {**os.environ, "PYTHONPATH": str(root)}
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
        printed = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            log.seek(0)
            raise RunFailed(f"{name} failed ({process.returncode}): {log.read()[-2000:]}")
    result = {
        "wall_seconds": round(time.perf_counter() - started, 2),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
    }
    if name not in ("before", "after"):
        return {**result, **json.loads(printed)}
    folder = Path(printed.strip())
    stats = read_stats(folder)
    splits = stats["splits"].values()
    # The blocks and the split, whatever files hold them.
    blocks = {**block_digests(folder), DOCUMENT_SPLIT_FILE: stats["files"][DOCUMENT_SPLIT_FILE]}
    return {
        **result,
        "num_blocks": sum(split["num_blocks"] for split in splits),
        "num_dropped_tokens": sum(split["num_dropped_tokens"] for split in splits),
        "num_tokens": stats["num_tokens"],
        "num_documents": stats["num_documents"],
        "stage_seconds": stats["seconds"],
        "files": blocks,
    }


def block_digests(folder: Path) -> dict[str, str]:
    """Per split, a digest of its token ids in order: from its Arrow file, or from the Arrow
    shards of its folder in caches before PIPELINE_VERSION 6."""
    digests = {}
    for split in SPLITS:
        digest = hashlib.sha256()
        for path in [*folder.glob(f"{split}.arrow"), *sorted(folder.glob(f"{split}/*.arrow"))]:
            with pa.memory_map(str(path)) as source:
                for batch in pa.ipc.open_stream(source):
                    digest.update(batch.column("input_ids").flatten().to_numpy().tobytes())
        digests[split] = digest.hexdigest()
    return digests


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


def size_on_disk_mb(paths: list[str]) -> float:
    """MB (1e6 bytes) of the files at `paths` (or glob patterns), folders walked."""
    matches = (Path(match) for path in paths for match in glob.glob(path, recursive=True))
    files = chain.from_iterable([match, *match.rglob("*")] for match in matches)
    return sum(file.stat().st_size for file in files if file.is_file()) / 1e6


def compare(args: BenchArguments, corpus: list[str], size_mb: float, work_dir: Path, roots):
    """The contenders side by side on one corpus, `args.repeats` times; one row per repeat."""
    too_large = ("before", "recipe") if size_mb > args.in_memory_max_mb else ()
    contenders = [name for name in args.contenders if name not in too_large]
    warmup = [str(write_corpus_slice(corpus, work_dir / "warmup.txt", WARMUP_DOCUMENTS, 1e9))]
    for name in contenders:
        measure(name, warmup, args, work_dir / f"warmup-{name}", roots)
    repeats = []
    for repeat in range(args.repeats):
        order = contenders if repeat % 2 == 0 else contenders[::-1]
        results = {
            name: measure(name, corpus, args, work_dir / f"{name}{repeat}", roots) for name in order
        }
        if {"before", "after"} <= set(results):
            same = results["before"]["files"] == results["after"]["files"]
            results["after"]["identical_blocks"] = same
        for result in results.values():
            result.pop("files", None)
        logger.info("%s MB, repeat %d: %s", size_mb, repeat, json.dumps(results))
        repeats.append(results)
    return repeats


def spread(values: list[float]) -> str:
    """One value as is; several as min / median / max."""
    values = sorted(values)
    if len(values) == 1:
        return f"{values[0]:,}"
    return f"{values[0]:,} / {round(statistics.median(values), 2):,} / {values[-1]:,}"


def summary_table(rows: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: per corpus and contender, each measure over the repeats; the blocks made."""
    header = ["corpus", "contender", "wall seconds", "CPU seconds", "peak RSS (MB)",
              "blocks (dropped)"]  # fmt: skip
    body = []
    for corpus, repeats in rows.items():
        for name in [name for name in CONTENDERS if name in repeats[0]]:
            cells = [
                spread([repeat[name][measure] for repeat in repeats])
                for measure in ("wall_seconds", "cpu_seconds", "peak_rss_mb")
            ]
            first = repeats[0][name]
            blocks = ""
            if "num_blocks" in first:
                blocks = f"{first['num_blocks']:,} ({first['num_dropped_tokens']:,})"
            if "identical_blocks" in first:
                same = all(repeat[name]["identical_blocks"] for repeat in repeats)
                blocks += ", identical to before" if same else ", DIFFERENT from before"
            body.append([corpus, name, *cells, blocks])
    return "\n".join(markdown_table(header, body))


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args(
        [BenchArguments], argv, description=__doc__, prog="python -m bench.prepare"
    )
    datasets.disable_progress_bars()
    if args.child is not None:
        print(json.dumps({"recipe": run_clm_recipe, "tokenizer": tokenize_only}[args.child](args)))
        return 0
    # The children run in other folders: every path absolute.
    args.corpus = [str(Path(path).absolute()) for path in args.corpus]
    if args.tokenizer_dir is not None:
        args.tokenizer_dir = str(Path(args.tokenizer_dir).absolute())
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        work_dir = Path(tmp)
        roots = {"before": work_dir / "baseline"}
        if "before" in args.contenders:  # the only one that runs the baseline's code
            roots["before"].mkdir()
            export = f"git -C {REPO_ROOT} archive {args.baseline_commit} | tar -x"
            subprocess.run(export, shell=True, check=True, cwd=roots["before"])
        for size_mb in [size_on_disk_mb(args.corpus)] if args.corpus else args.sizes_mb:
            corpus = args.corpus or [
                str(synthesize_wos_corpus(work_dir / f"corpus{size_mb}", int(size_mb * 1e6)))
            ]
            if args.tokenizer_dir is None:
                training_slice = write_corpus_slice(
                    corpus, work_dir / "tokenizer_text.txt", None, args.tokenizer_training_mb
                )
                args.tokenizer_dir = str(work_dir / "tokenizer")
                train_tokenizer(
                    CorpusArguments(corpus=[str(training_slice)]),
                    TokenizerArguments(
                        output_dir=args.tokenizer_dir, vocab_size=args.tokenizer_vocab_size
                    ),
                    show_progress=False,
                )
            label = ", ".join(args.corpus) if args.corpus else f"{size_mb:g} MB synthetic"
            (work_dir / "runs").mkdir()
            rows[label] = compare(args, corpus, size_mb, work_dir / "runs", roots)
            for used in ("runs", f"corpus{size_mb}"):  # the next size needs the disk
                shutil.rmtree(work_dir / used, ignore_errors=True)
        vocab_size = len(load_tokenizer(args.tokenizer_dir))
    table = summary_table(rows)
    result = {"vocab_size": vocab_size, "table": table, "runs": rows, "config": asdict(args),
              "hardware": hardware_description(), "versions": library_versions()}  # fmt: skip
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
