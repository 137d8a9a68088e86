"""GPT-2 117M on 12M tokens on one GPU: the course run as shipped, and the ablations that decide
its speed defaults, each a whole run (launch to summary: compile and checkpoints included).

    bash bench/gpu_12m.sh [--corpus data/WebOfScience.zip]  # installs wheels, then runs this
    bash bench/gpu_12m.sh --scale dry_run                   # every row on CPU, tiny model

First the inputs, kept in --output_dir for a rerun: the corpus (else up to 60 MB of the
installed packages' docstrings), a BPE of 32,768 tokens, the blocks of exactly 12M training
tokens. Then one pretrain/run.py process per row of ROWS, in order, until --time_limit_s is
spent (the row then running is stopped); a rerun reads the finished rows back and trains the
rest. The rows share one compile cache, emptied before `main`: `main` compiles cold,
`main_warm` warm. The table's columns come from each run_summary.json (docs/BENCHMARKS.md).
--scale dry_run: every row is the tiny model on CPU (16,384 tokens, compiled rows with
dynamo's `eager` backend): it checks every row and the table, not speed. --scale cpu: the tiny
model on CPU compiled for real (cold vs warm compile cache, compiles after the first step, the
time budget); --scale cpu_117m: the 117M shape on CPU, eager, 8 steps of one 128-token block
(what checkpoints of the real model cost).
"""

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from transformers.hf_argparser import HfArg

from bench.compare_recipes import recipe_flags
from bench.docstring_corpus import CORPUS_FILE, DocstringCorpusArguments, write_docstring_corpus
from bench.variants import REPO_ROOT, finished_earlier, repo_environment, run_variant
from common.cli import entry_point, parse_args
from common.corpus import CorpusArguments
from common.system import hardware_description, library_versions
from common.values import NOT_NEGATIVE
from pretrain.blocks.cache import prepare_blocks
from pretrain.run import parse_pretrain_args
from report.tables import markdown_table

logger = logging.getLogger(__name__)

COURSE_CONFIG = REPO_ROOT / "pretrain" / "configs" / "gpt2_117m.yaml"
RUN_SCRIPT = REPO_ROOT / "pretrain" / "run.py"
# Row -> flags on top of the shipped config, most decisive first: a time limit cuts the last.
ROWS: dict[str, list[str]] = {
    "main": [],  # the course run as shipped, compile cache cold
    "main_warm": [],  # the same, compile cache warm: the reference of every ratio
    "eager": ["--torch_compile", "false"],
    # AdamW for every parameter (bench/recipes/adamw.yaml): the course recipe before Muon.
    "adamw": recipe_flags("adamw"),
    # The course's Muon recipe until 2026-12-04 (bench/recipes/muon_constant.yaml): rate held.
    "muon_constant": recipe_flags("muon_constant"),
    # The course config's earlier checkpoints: every 50 of its 184 steps (0.27 of them, so that
    # the CPU scales save as often), and at the end; it now writes none.
    "checkpoints": ["--save_strategy", "steps", "--save_steps", "0.27"],
    "loss_hf": ["--loss_implementation", "hf"],
    "gelu_new": ["--activation_function", "gelu_new"],  # GPT-2's code: several kernels
    "batch_128": ["--per_device_train_batch_size", "128"],
    "batch_32": ["--per_device_train_batch_size", "32"],
    "compile_full_model": ["--compile_regions", "false"],  # one graph for the whole model
}
COLD_ROW, REFERENCE_ROW = "main", "main_warm"


@dataclass(frozen=True)
class Scale:
    corpus_megabytes: float
    vocab_size: int
    train_tokens: int
    time_limit_s: float  # the default of --time_limit_s
    flags: tuple[str, ...] = ()  # on top of every row's


# On a GPU lent for 15 minutes: two calls of 330 s (the second continuing the first) and the
# machine's start.
GPU = Scale(60, 32768, 12_000_000, 330)
CPU_TINY = ("--model_preset", "tiny", "--block_size", "64", "--use_cpu", "true",
            "--dataloader_num_workers", "0")  # fmt: skip
SCALES = {
    "gpu": GPU,
    "dry_run": Scale(2, 1024, 16384, 1200, CPU_TINY),
    "cpu": Scale(2, 2048, 65536, 3600, CPU_TINY),
    "cpu_117m": Scale(
        2, 32768, 8 * 128, 3600,
        ("--block_size", "128", "--per_device_train_batch_size", "1", "--use_cpu", "true",
         "--torch_compile", "false",
         "--dataloader_num_workers", "0"),
    ),
}  # fmt: skip


@dataclass
class AblationArguments:
    output_dir: str | None = HfArg(
        default=None,
        help="Folder of inputs, runs and table.md (default: runs/bench_gpu_12m, with "
        "another --scale runs/bench_gpu_12m_<scale>).",
    )
    corpus: list[str] = HfArg(
        default_factory=list, help="Corpus paths (default: the installed packages' docstrings)."
    )
    tokenizer_dir: str | None = HfArg(
        default=None, help="Tokenizer folder (default: trained on the corpus into output_dir)."
    )
    rows: list[str] = HfArg(
        default_factory=lambda: list(ROWS),
        help="Rows to run, in the order listed.",
        metadata={"choices": list(ROWS)},
    )
    time_limit_s: float | None = HfArg(
        default=None,
        help="Seconds for everything, inputs included (default: "
        + ", ".join(f"{name} {scale.time_limit_s:g}" for name, scale in SCALES.items())
        + "): a row still running then is stopped; the table shows what finished, a "
        "rerun continues.",
        metadata={"range": NOT_NEGATIVE},  # 0: no time left, the finished rows read back
    )
    scale: str = HfArg(
        default="gpu",
        help="The course run on a GPU; dry_run: every row tiny on CPU, a check of the "
        "script; cpu, cpu_117m: what runs measure on a CPU (the module's docstring).",
        metadata={"choices": list(SCALES)},
    )

    def __post_init__(self) -> None:
        if self.output_dir is None:
            self.output_dir = "runs/bench_gpu_12m" + (
                "" if self.scale == "gpu" else f"_{self.scale}"
            )
        if self.time_limit_s is None:
            self.time_limit_s = SCALES[self.scale].time_limit_s


def prepare_inputs(args: AblationArguments, scale: Scale) -> tuple[list[str], str]:
    """The corpus and the tokenizer: the given ones, else made in (or kept from) output_dir."""
    from tokenizer.train import TokenizerArguments, train_tokenizer

    output_dir = Path(args.output_dir)
    corpus = args.corpus or [str(output_dir / "corpus" / CORPUS_FILE)]
    if not args.corpus and not Path(corpus[0]).is_file():
        folder, megabytes = str(output_dir / "corpus"), scale.corpus_megabytes
        write_docstring_corpus(DocstringCorpusArguments(folder, megabytes, [], os.cpu_count()))
    # One tokenizer folder per corpus and vocabulary: a rerun with others never reuses it, and
    # its rows, whose flags name the folder, are not read back.
    made_for = hashlib.sha256(json.dumps([corpus, scale.vocab_size]).encode()).hexdigest()
    tokenizer_dir = args.tokenizer_dir or str(output_dir / f"tokenizer-{made_for[:12]}")
    if not Path(tokenizer_dir).is_dir():
        tokenizer_args = TokenizerArguments(tokenizer_dir, scale.vocab_size)
        train_tokenizer(CorpusArguments(corpus=corpus), tokenizer_args, show_progress=False)
    return corpus, tokenizer_dir


def row_command(
    args: AblationArguments, scale: Scale, name: str, corpus: list[str], tokenizer_dir: str
) -> list[str]:
    """The `pretrain/run.py` command line of one row."""
    output_dir = Path(args.output_dir)
    flags = [
        "--config", str(COURSE_CONFIG),
        "--corpus", *corpus,
        "--tokenizer_dir", tokenizer_dir,
        "--cache_dir", str(output_dir / "cache"),
        "--compile_cache_dir", str(output_dir / "compile_cache"),
        "--max_train_tokens", str(scale.train_tokens),
        "--repeat_corpus", "true",
        "--output_dir", str(output_dir / "runs" / name),
        "--disable_tqdm", "true",
        *scale.flags,
        *ROWS[name],
    ]  # fmt: skip
    if scale is SCALES["dry_run"] and parse_pretrain_args(flags).training.torch_compile:
        flags += ["--torch_compile_backend", "eager"]  # graph capture without code generation
    return [sys.executable, str(RUN_SCRIPT), *flags]


def run_rows(args: AblationArguments, commands: dict[str, list[str]], deadline: float) -> dict:
    """Each row's run summary, or {"failed": why}, in order until the deadline."""
    results = {}
    for name, command in commands.items():
        run_dir = Path(args.output_dir, "runs", name)
        summary = finished_earlier(command, run_dir)
        remaining = deadline - time.monotonic()
        if summary is None and remaining <= 0:
            summary = {"failed": "not run: time limit (a rerun continues)"}
        elif summary is None:
            if name == COLD_ROW:
                shutil.rmtree(Path(args.output_dir, "compile_cache"), ignore_errors=True)
            logger.info("%s: training, log %s.log", name, run_dir)
            outcome = run_variant(command, run_dir, repo_environment(), timeout_s=remaining)
            summary = outcome.summary or {"failed": outcome.error}
        results[name] = summary
    return results


def number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(results: dict[str, dict]) -> str:
    parts = list(dict.fromkeys(k for r in results.values() for k in r.get("time_budget", {})))
    header = ["row", "whole run s", f"vs {REFERENCE_ROW}", *(f"{part} s" for part in parts)]
    header += ["checkpoint saves", "compiles", "loop s", "tokens/s", "MFU", "peak GiB"]
    header += ["final loss", "steps"]
    reference = results.get(REFERENCE_ROW, {}).get("wall_seconds")
    rows = []
    for name, summary in results.items():
        if "failed" in summary:
            failed = summary["failed"].replace("|", "/")
            rows.append([name, f"FAILED: {failed}"] + [""] * (len(header) - 2))
            continue
        saves = summary.get("checkpoint_saves")
        compiles = summary.get("compile")
        budget = summary.get("time_budget", {})
        cells = [
            name,
            number(summary["wall_seconds"], ".1f"),
            number(reference and summary["wall_seconds"] / reference, ".2f"),
            *(number(budget.get(part), ".1f") for part in parts),
            "-" if saves is None else f"{len(saves)} in {sum(s['seconds'] for s in saves):.1f} s",
            "-" if compiles is None else f"{compiles['compiles']} + {compiles['recompiles']}",
            number(summary["train_loop_seconds"], ".1f"),
            number(summary["tokens_per_second"], ",.0f"),
            number(summary["mfu"], ".1%"),
            number(summary["peak_memory_gib"], ".1f"),
            number(summary["final_loss"], ".3f"),
            str(summary["global_step"]),
        ]
        rows.append(cells)
    return "\n".join(markdown_table(header, rows))


@entry_point
def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    prog = "python -m bench.gpu_ablation"
    (args,) = parse_args([AblationArguments], argv, description=__doc__, prog=prog)
    scale = SCALES[args.scale]
    corpus, tokenizer_dir = prepare_inputs(args, scale)
    commands = {name: row_command(args, scale, name, corpus, tokenizer_dir) for name in args.rows}
    # The packed blocks of every row, built before the first row's clock starts.
    parsed = parse_pretrain_args(next(iter(commands.values()))[2:])
    prepare_blocks(parsed.corpus, parsed.data)
    inputs_seconds = time.monotonic() - started
    results = run_rows(args, commands, started + args.time_limit_s)
    gpus = [gpu["name"] for gpu in hardware_description().get("gpus", [])]
    versions = ", ".join(f"{name} {version}" for name, version in library_versions().items())
    lines = [
        f"{time.strftime('%Y-%m-%d')}, {', '.join(gpus) or 'no GPU'}; {versions}",
        f"corpus {' '.join(corpus)}; corpus, tokenizer and blocks made or found in "
        f"{inputs_seconds:.0f} s, {time.monotonic() - started:.0f} s in all",
        "",
        format_table(results),
    ]
    Path(args.output_dir, "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 1 if any("failed" in summary for summary in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
