"""Run the 12M-token GPT-2 job and its speed ablation, then print one table.

Called by `bench/gpu_12m.sh` once the corpus, tokenizer and packed blocks exist. Each variant
is a separate `pretrain/run.py` process (so its end-to-end time, compile time and peak memory
are its own) on the same blocks:

- `main`: `pretrain/configs/gpt2_117m.yaml` as shipped, the whole token budget;
- the others change one setting of it and stop after `--ablation_steps` optimizer steps (their
  speed is settled by then; their loss is not comparable with the full run's).

Columns, from each run's `run_summary.json`: tokens/s over the whole training loop (first step
included) and after the first step; MFU of the whole loop; loop and end-to-end (launch to
summary) seconds; how much longer the first step took than a later one (torch.compile, CUDA
warm-up); peak GPU memory of the tensors; the final loss (mean of the last logged losses);
steps and tokens trained.

With `--dry_run` every run is the `tiny` model on CPU for a few steps and compiled variants use
the `eager` dynamo backend (graph capture without code generation), to check the whole script
in a minute or two; its numbers mean nothing.

    python bench/gpu_ablation.py --corpus C --tokenizer_dir T --cache_dir D --output_dir O
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.variants import run_variant, steady_step_seconds
from common.cli import InputError, entry_point, parse_args
from report.tables import markdown_table

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
MAIN_CONFIG = REPO_ROOT / "pretrain" / "configs" / "gpt2_117m.yaml"
COURSE_TOKENS = 12_000_000

# name -> flags on top of the shipped config. Each changes one lever of the main run.
VARIANTS: dict[str, list[str]] = {
    "main": [],
    "eager": ["--torch_compile", "false"],
    "compile_full_model": ["--torch_compile", "true", "--compile_regions", "false"],
    "loss_hf": ["--loss_implementation", "hf"],
    "batch_32": ["--per_device_train_batch_size", "32"],
    "batch_128": ["--per_device_train_batch_size", "128"],
    "no_checkpoints": ["--save_strategy", "no"],
}
# The dry run: the tiny model on CPU, small blocks, a few steps.
DRY_RUN_FLAGS = [
    "--model_preset", "tiny", "--block_size", "64", "--use_cpu", "true",
    "--per_device_train_batch_size", "8", "--dataloader_num_workers", "0",
]  # fmt: skip
DRY_RUN_BATCH_SIZES = {"batch_32": "4", "batch_128": "16"}


@dataclass
class AblationArguments:
    corpus: list[str] = field(metadata={"help": "Corpus paths (as for pretrain/run.py)."})
    tokenizer_dir: str = field(metadata={"help": "Tokenizer folder."})
    cache_dir: str = field(metadata={"help": "Packed-block cache folder (already prepared)."})
    output_dir: str = field(metadata={"help": "Folder for one run folder per variant."})
    max_train_tokens: int = field(
        default=COURSE_TOKENS, metadata={"help": "Token budget of the main run."}
    )
    ablation_steps: int = field(
        default=40, metadata={"help": "Optimizer steps of each ablation run."}
    )
    variants: list[str] = field(
        default_factory=lambda: list(VARIANTS),
        metadata={"help": f"Which runs, in order: {', '.join(VARIANTS)}."},
    )
    dry_run: bool = field(
        default=False,
        metadata={"help": "Tiny model on CPU, a few steps each: checks the script, not speed."},
    )

    def __post_init__(self) -> None:
        unknown = [name for name in self.variants if name not in VARIANTS]
        if unknown:
            raise InputError(
                f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}"
            )


def variant_command(args: AblationArguments, name: str) -> list[str]:
    """The `pretrain/run.py` command line of one variant."""
    command = [
        sys.executable, str(REPO_ROOT / "pretrain" / "run.py"),
        "--config", str(MAIN_CONFIG),
        "--corpus", *args.corpus,
        "--tokenizer_dir", args.tokenizer_dir,
        "--cache_dir", args.cache_dir,
        "--max_train_tokens", str(args.max_train_tokens),
        "--repeat_corpus",
        "--output_dir", str(Path(args.output_dir) / name),
    ]  # fmt: skip
    flags = list(VARIANTS[name])
    if args.dry_run:
        command += DRY_RUN_FLAGS
        if name in DRY_RUN_BATCH_SIZES:
            flags[flags.index("--per_device_train_batch_size") + 1] = DRY_RUN_BATCH_SIZES[name]
    command += flags
    if name != "main":
        command += ["--max_steps", str(args.ablation_steps)]
    if args.dry_run and compiles(command):
        command += ["--torch_compile_backend", "eager"]
    return command


def compiles(command: list[str]) -> bool:
    """Whether the run will use torch.compile: the last --torch_compile flag, else the config."""
    if "--torch_compile" in command:
        last = len(command) - 1 - command[::-1].index("--torch_compile")
        return command[last + 1].lower() == "true"
    return bool(yaml.safe_load(MAIN_CONFIG.read_text()).get("torch_compile", False))


def train_variant(args: AblationArguments, name: str) -> dict:
    """Run one variant as its own process; its run summary, or {"failed": why}."""
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    log_path = output_dir / f"{name}.log"
    logger.info("%s: log %s", name, log_path)
    outcome = run_variant(variant_command(args, name), output_dir / name, log_path)
    if outcome.summary is None:
        logger.error("%s failed: %s", name, outcome.error)
        return {"failed": outcome.error}
    return outcome.summary


HEADER = [
    "run",
    "tokens/s",
    "after 1st step",
    "MFU",
    "loop s",
    "end-to-end s",
    "1st step extra s",
    "peak GiB",
    "final loss",
    "steps",
    "tokens",
]


def first_step_extra_seconds(summary: dict) -> float | None:
    """How much longer the first step took than an average later one: torch.compile's work
    (plus CUDA's one-time warm-up, which is all an eager run shows here)."""
    first, loop = summary.get("first_step_seconds"), summary.get("train_loop_seconds")
    steps = summary.get("global_step", 0) - summary.get("resumed_from_step", 0)
    if first is None or loop is None or steps < 2:
        return None
    return first - (loop - first) / (steps - 1)


def tokens_per_second_after_first_step(summary: dict) -> float | None:
    """The steady speed: every step but the first (a last partial batch counts as full)."""
    step_seconds = steady_step_seconds(summary)
    return None if step_seconds is None else summary["global_batch_tokens"] / step_seconds


def format_row(name: str, summary: dict) -> list[str]:
    if "failed" in summary:
        return [name, f"FAILED: {summary['failed']}".replace("|", "/")] + [""] * (len(HEADER) - 2)

    def number(key: str, fmt: str) -> str:
        value = summary.get(key)
        return "-" if value is None else format(value, fmt)

    compile_seconds = first_step_extra_seconds(summary)
    steady = tokens_per_second_after_first_step(summary)
    return [
        name,
        number("tokens_per_second", ",.0f"),
        "-" if steady is None else f"{steady:,.0f}",
        number("mfu", ".1%"),
        number("train_loop_seconds", ".1f"),
        number("wall_seconds", ".1f"),
        "-" if compile_seconds is None else f"{compile_seconds:.1f}",
        number("peak_memory_gib", ".1f"),
        number("final_loss", ".3f"),
        f"{summary.get('global_step', '-')}",
        number("tokens_trained", ",d"),
    ]


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args(
        [AblationArguments],
        argv,
        description=__doc__,
        prog="bench/gpu_ablation.py",
    )
    summaries = {name: train_variant(args, name) for name in args.variants}
    table = "\n".join(
        markdown_table(HEADER, [format_row(name, summary) for name, summary in summaries.items()])
    )
    Path(args.output_dir, "table.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 1 if any("failed" in summary for summary in summaries.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
