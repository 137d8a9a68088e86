"""Training recipes side by side: our configs against the recipes users copy, by measurement.

A recipe is a YAML file in bench/recipes/: the optimiser settings that differ from
pretrain/configs/gpt2_117m.yaml, their source in a comment. A row (`--recipes`) is a recipe's
name, optionally followed by flags in the same argument (`"course_before --learning_rate
5.0e-4"`); flags after `--` go to every run (the corpus; a batch with its token budget). A run:

    pretrain/run.py --config pretrain/configs/gpt2_117m.yaml PROXY_FLAGS [flags after --]
        [the recipe's keys as flags] [the row's flags] --tokenizer_dir T --seed S --output_dir D

PROXY_FLAGS shrink the course run to a CPU proxy, so every row trains the same model on the
same blocks for the same steps from the same seeds, judged by its validation loss on the same
held-out blocks. Columns: the loss of each seed, mean, spread, bits per byte, the largest rise
of the logged loss above its running minimum (a spike), the settings the runs resolved; with
several `--tokenizer_dirs`, vocabularies too (docs/BENCHMARKS.md). A finished run whose log
starts with the same flags is read back. The table also goes to `<output_dir>/table.md`.

    python -m bench.compare_recipes --tokenizer_dirs runs/bench/tokenizer-8192 \\
        --recipes tiny nanogpt_small -- --corpus runs/bench/corpus/docstrings.txt
"""

import functools
import json
import logging
import re
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers.hf_argparser import HfArg

from bench.variants import REPO_ROOT, repo_environment, run_variant
from common.cli import InputError, entry_point, load_config_file, parse_args
from common.corpus import resolve_sources
from common.run_contract import TRAIN_LOSS
from report.run_folder import load_run
from report.tables import markdown_table

logger = logging.getLogger(__name__)

RECIPE_DIR = Path(__file__).resolve().parent / "recipes"
RUN_SCRIPT = REPO_ROOT / "pretrain" / "run.py"
BASE_CONFIG = REPO_ROOT / "pretrain" / "configs" / "gpt2_117m.yaml"
PROXY_FLAGS = [
    "--model_preset", "proxy",
    "--block_size", "64",
    "--per_device_train_batch_size", "16",
    "--max_train_tokens", str(184 * 16 * 64),  # the course's 184 steps
    "--cache_dir", "runs/bench/cache",
    "--use_cpu", "true",
    "--torch_compile", "false",
    "--loss_implementation", "hf",
    "--dataloader_num_workers", "0",
    # Every 4 steps from the 4th: the loss curve of the spike column.
    "--logging_steps", "4",
    "--logging_first_step", "false",
    "--save_strategy", "no",
    "--disable_tqdm", "true",
    "--expected_final_loss", "none",  # the course run's prediction is not a proxy's
]  # fmt: skip


@dataclass
class RecipeBenchArguments:
    tokenizer_dirs: list[str] = HfArg(help="Tokenizer folder(s); several compare vocabularies.")
    recipes: list[str] = HfArg(
        default_factory=lambda: ["tiny", "nanogpt_small", "nanogpt_gpt2", "run_clm"],
        help="Rows: a recipe name (a file in bench/recipes/, or a YAML path), optionally "
        "followed by pretrain/run.py flags in the same argument.",
    )
    seeds: list[int] = HfArg(
        default_factory=lambda: [0, 1, 2],
        help="Training seeds (initial weights and block order) of every row.",
    )
    output_dir: str = HfArg(default="runs/bench/recipes", help="Folder for table.md and the runs.")
    num_threads: int = HfArg(
        default=1, help="Torch threads per run: 1 keeps each seed's losses exactly repeatable."
    )
    num_parallel_runs: int = HfArg(default=1, help="Runs at a time.")


def recipe_flags(spec: str) -> list[str]:
    """A row's flags: its recipe file's keys (a mapping as JSON, as TrainingArguments reads
    it), then the row's own flags."""
    name, *row_flags = shlex.split(spec)
    path = Path(name) if name.endswith(".yaml") else RECIPE_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")))
        raise InputError(f"unknown recipe '{name}' in '{spec}'; choose from {known}")
    flags = []
    for key, value in load_config_file(path).items():
        flags += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return flags + row_flags


@dataclass(frozen=True)
class Run:
    row: str
    tokenizer_dir: str
    output_dir: Path
    flags: list[str]


def plan_runs(args: RecipeBenchArguments, shared_flags: list[str]) -> list[Run]:
    """Every run, its flags checked by pretrain/run.py's own parser before any trains."""
    from pretrain.run import parse_pretrain_args

    runs = []
    for tokenizer_dir in args.tokenizer_dirs:
        if not Path(tokenizer_dir).is_dir():
            raise InputError(
                f"tokenizer folder {tokenizer_dir} does not exist; make it with "
                "train-tokenizer --corpus ... --output_dir DIR --vocab_size N"
            )
        for row in args.recipes:
            flags = ["--config", str(BASE_CONFIG), *PROXY_FLAGS, *shared_flags]
            flags += [*recipe_flags(row), "--tokenizer_dir", tokenizer_dir]
            resolve_sources(parse_pretrain_args(flags).corpus)
            name = re.sub(r"[^A-Za-z0-9._=]+", "-", row)
            folder = Path(args.output_dir, "runs", Path(tokenizer_dir).name, name)
            for seed in args.seeds:
                run_dir = folder / f"seed{seed}"
                run_flags = [*flags, "--seed", str(seed), "--output_dir", str(run_dir)]
                runs.append(Run(row, tokenizer_dir, run_dir, run_flags))
    return runs


def train(run: Run, num_threads: int) -> dict | None:
    """Train one run in its own process (or read back the same flags' finished run); what the
    table needs from it, or None when it failed."""
    command = [sys.executable, str(RUN_SCRIPT), *run.flags]
    env = repo_environment(OMP_NUM_THREADS=str(num_threads), TOKENIZERS_PARALLELISM="false")
    outcome = run_variant(command, run.output_dir, env, read_back=True)
    if outcome.summary is None:
        logger.error("%s failed: %s", run.output_dir, outcome.error)
        return None
    losses = load_run(run.output_dir).scalars.get(TRAIN_LOSS)
    return {**outcome.summary, "loss_rise": largest_loss_rise(losses.values if losses else [])}


def largest_loss_rise(losses) -> float:
    """How far the loss climbed above the lowest value it had reached before (0: never)."""
    return float(np.max(losses - np.minimum.accumulate(losses), initial=0.0))


def settings_cells(config: dict) -> list[str]:
    """A run's optimiser settings as the table shows them: 1.0e-3 | 5% | cosine to 10% | ..."""
    training, muon = config["TrainingArguments"], config.get("MuonArguments", {})
    schedule, kwargs = training["lr_scheduler_type"], training["lr_scheduler_kwargs"] or {}
    warmup = 0 if schedule == "constant" else training["warmup_steps"]  # constant ignores it
    if schedule.startswith("constant"):
        schedule = "constant"
    elif schedule == "warmup_stable_decay":
        decay = kwargs["num_decay_steps"]  # a run's summary holds the steps of a share
        decay = f"{decay:.0%} of the steps" if 0 < decay < 1 else f"{decay} steps"
        schedule = (
            f"constant, then {kwargs['decay_type']} to {kwargs['min_lr_ratio']:.0%} over the "
            f"last {decay}"
        )
    else:
        schedule = f"{schedule.removesuffix('_with_min_lr')} to {kwargs.get('min_lr_rate', 0):.0%}"

    def rate(value: float) -> str:
        return f"{value:.1e}".replace("e-0", "e-")

    matrices = "AdamW"
    if muon.get("muon"):
        embeddings = muon["embedding_learning_rate"] or training["learning_rate"]
        matrices = (
            f"Muon {rate(muon['muon_learning_rate'])}, momentum {muon['muon_momentum']:g}, "
            f"decay {muon['muon_weight_decay']:g}; embeddings {rate(embeddings)}"
        )
    return [
        rate(training["learning_rate"]),
        f"{warmup * 100:.2g}%" if warmup < 1 else f"{warmup:g} steps",
        schedule,
        *(f"{training[key]:g}" for key in ("adam_beta2", "weight_decay", "max_grad_norm")),
        matrices,
    ]


@functools.cache
def gpt2_117m_flops_per_token(tokenizer_dir: str, vocab_size: int) -> float:
    """Training FLOPs per token of the course's GPT-2 117M with this vocabulary, by the formula
    run_summary.json uses; the weights are never allocated."""
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from pretrain.metrics import flops_per_token
    from pretrain.model import build_model_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False)
    with torch.device("meta"):
        model = GPT2LMHeadModel(build_model_config("gpt2-117m", tokenizer, 1024, vocab_size))
    return flops_per_token(model, 1024)


def vocabulary_cells(tokenizer_dir: str, summary: dict) -> tuple[list[str], list[str]]:
    """(vocabulary, bytes/token) and (FLOPs per token and per byte, of the proxy and of GPT-2
    117M, unigram entropy) of one tokenizer's run."""
    from pretrain.summary import tokens_per_byte

    bytes_per_token = 1 / tokens_per_byte(summary["data"]["splits"]["validation"])
    vocab_size = summary["config"]["model_config"]["vocab_size"]
    proxy, course = summary["flops_per_token"], gpt2_117m_flops_per_token(tokenizer_dir, vocab_size)
    flops = [f"{proxy / 1e6:.1f}M", f"{proxy / bytes_per_token / 1e6:.2f}M",
             f"{course / 1e6:.0f}M", f"{course / bytes_per_token / 1e6:.0f}M"]  # fmt: skip
    entropy = f"{summary['data']['unigram_entropy_nats']:.3f}"
    return [f"{vocab_size:,}", f"{bytes_per_token:.2f}"], [*flops, entropy]


def format_table(runs: list[Run], results: list[dict | None], vocabularies: bool) -> str:
    """One Markdown row per recipe row (and tokenizer)."""
    header = ["recipe", "validation loss per seed", "mean", "spread", "bits/byte",
              "largest loss rise", "peak lr", "warmup", "schedule", "beta2", "weight decay",
              "clip", "hidden matrices"]  # fmt: skip
    if vocabularies:
        header[1:1] = ["vocabulary", "bytes/token"]
        header[8:8] = ["FLOPs/token", "FLOPs/byte", "117M FLOPs/token", "117M FLOPs/byte",
                       "unigram entropy"]  # fmt: skip
    groups: dict[tuple[str, str], list[dict | None]] = {}
    for run, result in zip(runs, results, strict=True):
        groups.setdefault((run.row, run.tokenizer_dir), []).append(result)
    rows = []
    for (row, tokenizer_dir), group in groups.items():
        per_seed = ", ".join("failed" if r is None else f"{r['eval_loss']:.3f}" for r in group)
        done = [result for result in group if result is not None]
        if not done:  # the tokenizer named in the vocabulary column
            cells = [row, Path(tokenizer_dir).name, "-"][: 3 if vocabularies else 1] + [per_seed]
            rows.append(cells + ["-"] * (len(header) - len(cells)))
            continue
        losses = [result["eval_loss"] for result in done]
        cells = [
            row,
            per_seed,
            f"{statistics.mean(losses):.3f}",
            f"{max(losses) - min(losses):.3f}",
            f"{statistics.mean(result['bits_per_byte'] for result in done):.3f}",
            f"{max(result['loss_rise'] for result in done):.3f}",
            *settings_cells(done[0]["config"]),
        ]
        if vocabularies:
            first, last = vocabulary_cells(tokenizer_dir, done[0])
            cells[1:1], cells[8:8] = first, last
        rows.append(cells)
    return "\n".join(markdown_table(header, rows))


@entry_point
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)  # after --: every run's flags
    prog = "python -m bench.compare_recipes"
    (args,) = parse_args([RecipeBenchArguments], argv[:split], description=__doc__, prog=prog)
    runs = plan_runs(args, argv[split + 1 :])
    logger.info("%d runs, %d at a time", len(runs), args.num_parallel_runs)
    with ThreadPoolExecutor(args.num_parallel_runs) as pool:
        results = list(pool.map(lambda run: train(run, args.num_threads), runs))
    table = format_table(runs, results, vocabularies=len(args.tokenizer_dirs) > 1)
    Path(args.output_dir, "table.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 1 if None in results else 0


if __name__ == "__main__":
    sys.exit(main())
