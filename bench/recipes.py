"""Training recipes side by side: our configs against the recipes users copy, by measurement.

Every recipe trains the same model (`--model_preset`, default `proxy`: 4 layers x 128 wide)
through our own trainer, `pretrain/run.py`, one process per run, on the same packed blocks,
for the same optimizer steps and tokens, from the same seeds, and is judged by the validation
loss on the same held-out blocks (`eval_loss` and `bits_per_byte` of each `run_summary.json`).
Only the recipe changes: peak learning rate, warmup, schedule and final learning rate, AdamW
betas, weight decay, gradient clipping. Schedules stretch to the run: a warmup given as a
fraction stays that fraction of the steps, and the decay ends at the last step.

Recipes (`--recipes`):
- `tiny`, `course`: what `pretrain/configs/tiny.yaml` and `gpt2_117m.yaml` say, read from them;
- `nanogpt_small`: nanoGPT's small-model recipe (karpathy/nanoGPT,
  config/train_shakespeare_char.py): lr 1e-3, beta2 0.99, warmup 100 of 5,000 steps, cosine to
  1e-4, with train.py's weight decay 0.1 and clipping at 1;
- `nanogpt_gpt2`: nanoGPT's GPT-2 124M recipe (train.py's defaults, config/train_gpt2.py; GPT-3
  small's): lr 6e-4, beta2 0.95, warmup 2,000 of 600,000 steps, cosine to 6e-5, weight decay
  0.1, clipping at 1;
- `run_clm`: what transformers' examples/pytorch/language-modeling/run_clm.py trains with when
  no optimisation flag is given, i.e. `TrainingArguments`' defaults (lr 5e-5, linear decay to
  0, no warmup, beta2 0.999, no weight decay, clipping at 1), read from the installed library.

Not reproduced: nanoGPT's dropout 0.2 for Shakespeare (one pass over the data here: every run
uses dropout 0) and its linear layers without biases (transformers' GPT-2 always has them).

A recipe can be varied in place, `NAME:field=value,...` with the fields of `Recipe`, e.g.
`course:learning_rate=3.0e-3,schedule=cosine,final_lr_fraction=0` (one row each); schedules:
cosine, linear, constant, and wsd (held, then a 1-sqrt cooldown over the last
`decay_fraction` of the steps). With several
`--tokenizer_dirs` every recipe runs with each tokenizer and the table compares vocabularies:
bytes per token, training FLOPs per token and per byte of text (of the proxy, and of GPT-2
117M with that vocabulary), loss per token and bits per byte.

Columns per row: the validation loss (nats per token) of each seed, their mean and spread (max -
min), bits per byte (mean), and the largest rise of the logged training loss above its running
minimum (the worst seed): a loss spike; then the recipe's settings. Raw results go to
`<output_dir>/results.json`; a run whose folder already holds the summary of the same command
is read back instead of rerun.

    python bench/recipes.py --corpus runs/bench/corpus/docstrings.txt \\
        --tokenizer_dirs runs/bench/tokenizer-8192 --output_dir runs/bench/recipes
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import re
import shutil
import statistics
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.variants import run_variant
from common.cli import InputError, entry_point, parse_args
from common.corpus import CorpusArguments, resolve_sources
from common.files import write_json_atomic
from common.run_contract import GPT_SUMMARY_FILE, TRAIN_LOSS
from report.run_folder import load_run
from report.tables import markdown_table

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "pretrain" / "configs"
RESULTS_FILE = "results.json"
SCHEDULES = ("cosine", "linear", "constant", "wsd")


@dataclass(frozen=True)
class Recipe:
    """How a run optimises: everything a recipe sets, in `pretrain/run.py`'s terms."""

    learning_rate: float
    warmup: float  # below 1: a fraction of the steps; else a number of steps
    # cosine or linear: decaying until the last step; constant; wsd: warmup, constant, and a
    # final decay (Hagele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed
    # Training Durations")
    schedule: str
    final_lr_fraction: float  # a decay ends at this fraction of the peak (constant: 1)
    adam_beta1: float
    adam_beta2: float
    weight_decay: float
    max_grad_norm: float
    # wsd: the constant learning rate falls over this last fraction of the steps
    decay_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise InputError(f"schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.schedule == "wsd" and not 0 < self.decay_fraction <= 1:
            raise InputError(f"decay_fraction {self.decay_fraction} must be in (0, 1]")
        if self.schedule == "constant":
            object.__setattr__(self, "final_lr_fraction", 1.0)
        if self.schedule == "linear" and self.final_lr_fraction != 0:
            raise InputError("a linear schedule decays to 0 here; pass final_lr_fraction=0")
        if not 0 <= self.final_lr_fraction < 1 and self.schedule != "constant":
            raise InputError(
                f"a {self.schedule} schedule decays to final_lr_fraction times the peak, which "
                f"must be in [0, 1), not {self.final_lr_fraction:g}: add final_lr_fraction=F "
                "(e.g. 0.1), or use schedule=constant for no decay"
            )

    def flags(self, num_steps: int) -> list[str]:
        """The `pretrain/run.py` flags of this recipe for a run of `num_steps` steps."""
        schedule = ["--lr_scheduler_type", self.schedule]
        if self.schedule == "constant":
            schedule = ["--lr_scheduler_type", "constant_with_warmup"]
        elif self.schedule == "wsd":
            # 1-sqrt: the cooldown shape Hagele et al. (2024) found best after a constant phase
            decay = {"num_decay_steps": max(1, round(self.decay_fraction * num_steps)),
                     "min_lr_ratio": self.final_lr_fraction, "decay_type": "1-sqrt"}  # fmt: skip
            schedule = ["--lr_scheduler_type", "warmup_stable_decay",
                        "--lr_scheduler_kwargs", json.dumps(decay)]  # fmt: skip
        elif self.final_lr_fraction > 0:
            floor = json.dumps({"min_lr_rate": self.final_lr_fraction})
            schedule = ["--lr_scheduler_type", "cosine_with_min_lr", "--lr_scheduler_kwargs", floor]
        return [
            "--learning_rate", repr(self.learning_rate),
            "--warmup_steps", repr(self.warmup),
            *schedule,
            "--adam_beta1", repr(self.adam_beta1),
            "--adam_beta2", repr(self.adam_beta2),
            "--weight_decay", repr(self.weight_decay),
            "--max_grad_norm", repr(self.max_grad_norm),
        ]  # fmt: skip


def training_defaults() -> dict[str, Any]:
    """The defaults of transformers' TrainingArguments for the keys a recipe sets."""
    from transformers import TrainingArguments

    return {f.name: f.default for f in dataclasses.fields(TrainingArguments)}


def recipe_from_options(options: dict[str, Any]) -> Recipe:
    """A recipe from Trainer options (a config file's), TrainingArguments' defaults elsewhere."""
    options = {**training_defaults(), **options}
    # A parsed TrainingArguments holds an enum member, a config file its value.
    scheduler = str(getattr(options["lr_scheduler_type"], "value", options["lr_scheduler_type"]))
    schedules = {"cosine": "cosine", "cosine_with_min_lr": "cosine", "linear": "linear",
                 "constant": "constant", "constant_with_warmup": "constant"}  # fmt: skip
    if scheduler not in schedules:
        raise InputError(f"lr_scheduler_type {scheduler} has no recipe equivalent here")
    final_fraction = 0.0
    if scheduler == "cosine_with_min_lr":
        final_fraction = float((options["lr_scheduler_kwargs"] or {}).get("min_lr_rate", 0.0))
    return Recipe(
        learning_rate=float(options["learning_rate"]),
        # transformers' "constant" schedule ignores any warmup it is given.
        warmup=0.0 if scheduler == "constant" else float(options["warmup_steps"]),
        schedule=schedules[scheduler],
        final_lr_fraction=final_fraction,
        adam_beta1=float(options["adam_beta1"]),
        adam_beta2=float(options["adam_beta2"]),
        weight_decay=float(options["weight_decay"]),
        max_grad_norm=float(options["max_grad_norm"]),
    )


def recipe_from_config(name: str) -> Recipe:
    return recipe_from_options(yaml.safe_load((CONFIG_DIR / name).read_text(encoding="utf-8")))


def peer_recipes() -> dict[str, Recipe]:
    """Recipes of other projects, as their sources state them (module docstring)."""
    return {
        "nanogpt_small": Recipe(
            learning_rate=1e-3, warmup=100 / 5000, schedule="cosine", final_lr_fraction=0.1,
            adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, max_grad_norm=1.0,
        ),
        "nanogpt_gpt2": Recipe(
            learning_rate=6e-4, warmup=2000 / 600_000, schedule="cosine", final_lr_fraction=0.1,
            adam_beta1=0.9, adam_beta2=0.95, weight_decay=0.1, max_grad_norm=1.0,
        ),
        "run_clm": recipe_from_options({}),
    }  # fmt: skip


def named_recipes() -> dict[str, Recipe]:
    return {
        "tiny": recipe_from_config("tiny.yaml"),
        "course": recipe_from_config("gpt2_117m.yaml"),
        **peer_recipes(),
    }


def resolve_recipe(spec: str, recipes: dict[str, Recipe]) -> Recipe:
    """`NAME` or `NAME:field=value,...` -> the recipe it names, with those fields replaced."""
    name, _, changes = spec.partition(":")
    if name not in recipes:
        raise InputError(f"unknown recipe '{name}' in '{spec}'; choose from {', '.join(recipes)}")
    recipe = recipes[name]
    types = {f.name: f.type for f in dataclasses.fields(Recipe)}
    replaced: dict[str, Any] = {}
    for change in filter(None, changes.split(",")):
        key, _, value = change.partition("=")
        if key not in types or not value:
            raise InputError(
                f"'{change}' in '{spec}' is not field=value with a field of {', '.join(types)}"
            )
        try:
            replaced[key] = value if types[key] == "str" else float(value)
        except ValueError:
            raise InputError(f"'{change}' in '{spec}': {value} is not a number") from None
    varied = dataclasses.replace(recipe, **replaced)
    if varied.schedule == "constant" and replaced.get("final_lr_fraction", 1.0) != 1.0:
        raise InputError(
            f"'{spec}': a constant schedule has no final learning rate; add schedule=cosine, "
            "linear or wsd, or drop final_lr_fraction"
        )
    return varied


@dataclass
class RecipeBenchArguments:
    corpus: list[str] = field(metadata={"help": "Corpus paths (as for pretrain/run.py)."})
    tokenizer_dirs: list[str] = field(
        metadata={"help": "Tokenizer folder(s); several compare vocabularies."}
    )
    output_dir: str = field(
        default="runs/bench/recipes",
        metadata={"help": "Folder for results.json and one run folder per run."},
    )
    cache_dir: str = field(
        default="runs/bench/cache", metadata={"help": "Packed-block cache folder."}
    )
    recipes: list[str] = field(
        default_factory=lambda: ["tiny", "nanogpt_small", "nanogpt_gpt2", "run_clm"],
        metadata={"help": "Recipes, one row each: NAME or NAME:field=value,... (see above)."},
    )
    seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2],
        metadata={"help": "Training seeds (initial weights and block order) of every recipe."},
    )
    model_preset: str = field(default="proxy", metadata={"help": "Model shape of every run."})
    block_size: int = field(default=64, metadata={"help": "Tokens per block."})
    batch_blocks: int = field(default=16, metadata={"help": "Blocks per optimizer step."})
    num_steps: int = field(
        default=184,
        metadata={"help": "Optimizer steps of every run (the course run's 184 by default)."},
    )
    repeat_corpus: bool = field(
        default=False,
        metadata={"help": "Repeat a corpus smaller than the token budget (the demo corpus)."},
    )
    logging_steps: int = field(
        default=4, metadata={"help": "Steps per logged training loss (for the spike column)."}
    )
    num_threads: int = field(
        default=1,
        metadata={"help": "Torch threads per run: 1 keeps each seed's losses exactly repeatable."},
    )
    num_parallel_runs: int = field(default=1, metadata={"help": "Runs at a time."})

    def __post_init__(self) -> None:
        counts = ("num_steps", "batch_blocks", "logging_steps", "num_threads", "num_parallel_runs")
        for name in counts:
            value = getattr(self, name)
            if value < 1:
                raise InputError(f"--{name} {value} must be at least 1")
        if not self.seeds:
            raise InputError("--seeds needs at least one seed")
        # Every run would fail on its own over a missing corpus: say it once, up front.
        resolve_sources(CorpusArguments(corpus=self.corpus))
        missing = [path for path in self.tokenizer_dirs if not Path(path).is_dir()]
        if missing:
            raise InputError(
                f"tokenizer folder(s) {', '.join(missing)} do not exist; make them with "
                "train-tokenizer --corpus ... --output_dir DIR --vocab_size N"
            )

    @property
    def num_train_tokens(self) -> int:
        return self.num_steps * self.batch_blocks * self.block_size


@dataclass(frozen=True)
class RunSpec:
    """One run: a recipe, a tokenizer, a seed, and the folder it trains into."""

    recipe_spec: str
    recipe: Recipe
    tokenizer_dir: str
    seed: int
    output_dir: Path


def data_flags(args: RecipeBenchArguments, tokenizer_dir: str) -> list[str]:
    """Corpus, tokenizer and budget: the same blocks for every run with this tokenizer."""
    flags = [
        "--corpus", *args.corpus,
        "--tokenizer_dir", tokenizer_dir,
        "--cache_dir", args.cache_dir,
        "--block_size", str(args.block_size),
        "--max_train_tokens", str(args.num_train_tokens),
    ]  # fmt: skip
    return flags + ["--repeat_corpus", "true"] if args.repeat_corpus else flags


def run_command(args: RecipeBenchArguments, run: RunSpec) -> list[str]:
    """The `pretrain/run.py` command line of one run: CPU, fp32, eager, no checkpoints."""
    return [
        sys.executable, str(REPO_ROOT / "pretrain" / "run.py"),
        *data_flags(args, run.tokenizer_dir),
        "--model_preset", args.model_preset,
        "--output_dir", str(run.output_dir),
        "--use_cpu", "true",
        "--per_device_train_batch_size", str(args.batch_blocks),
        "--per_device_eval_batch_size", "64",
        "--seed", str(run.seed),
        *run.recipe.flags(args.num_steps),
        "--logging_steps", str(args.logging_steps),
        "--eval_strategy", "no",
        "--save_strategy", "no",
        "--disable_tqdm", "true",
    ]  # fmt: skip


def train_run(command: list[str], run_dir: Path, num_threads: int) -> dict | None:
    """Train one run as its own process (log beside its folder); its run summary, or None."""
    environment = {**os.environ, "OMP_NUM_THREADS": str(num_threads),
                   "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    outcome = run_variant(command, run_dir, run_dir.with_suffix(".log"), env=environment)
    if outcome.summary is None:
        logger.error("%s failed: %s", run_dir, outcome.error)
    return outcome.summary


def logged_training_losses(run_dir: Path) -> list[float]:
    """The training losses the run logged to TensorBoard, in step order (the report's reader)."""
    losses = load_run(run_dir).scalars.get(TRAIN_LOSS)
    return [] if losses is None else losses.values.tolist()


def largest_loss_rise(losses: list[float]) -> float:
    """How far the loss climbed above the lowest value it had reached before (0: never)."""
    rise, lowest = 0.0, math.inf
    for loss in losses:
        rise = max(rise, loss - lowest)
        lowest = min(lowest, loss)
    return rise


def plan_runs(args: RecipeBenchArguments) -> list[RunSpec]:
    recipes = named_recipes()
    runs_dir = Path(args.output_dir) / "runs"
    return [
        RunSpec(
            spec,
            resolve_recipe(spec, recipes),
            tokenizer_dir,
            seed,
            runs_dir / Path(tokenizer_dir).name / folder_name(spec) / f"seed{seed}",
        )
        for tokenizer_dir in args.tokenizer_dirs
        for spec in args.recipes
        for seed in args.seeds
    ]


def folder_name(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", spec)


def run_result(args: RecipeBenchArguments, run: RunSpec, earlier: dict[str, dict]) -> dict:
    """Train one run (or read back the same command's finished run) and keep what the table
    and the record need."""
    command = run_command(args, run)
    previous = earlier.get(str(run.output_dir))
    summary_path = run.output_dir / GPT_SUMMARY_FILE
    # The flags alone: the interpreter and the checkout may live elsewhere on a rerun.
    flags = command[2:]
    if previous and previous["command"] == flags and summary_path.is_file():
        logger.info("%s: finished earlier, read back", run.output_dir)
        summary = json.loads(summary_path.read_text())
    else:
        shutil.rmtree(run.output_dir, ignore_errors=True)
        logger.info("%s: training", run.output_dir)
        summary = train_run(command, run.output_dir, args.num_threads)
    result = {
        "run_dir": str(run.output_dir),
        "recipe": run.recipe_spec,
        "recipe_settings": dataclasses.asdict(run.recipe),
        "tokenizer_dir": run.tokenizer_dir,
        "seed": run.seed,
        "command": flags,
        "failed": summary is None,
    }
    if summary is not None:
        losses = logged_training_losses(run.output_dir)
        result.update(
            eval_loss=summary["eval_loss"],
            bits_per_byte=summary["bits_per_byte"],
            validation_tokens_per_byte=validation_tokens_per_byte(summary),
            final_loss=summary["final_loss"],
            tokens_trained=summary["tokens_trained"],
            flops_per_token=summary["flops_per_token"],
            vocab_size=summary["config"]["model_config"]["vocab_size"],
            unigram_entropy_nats=summary["data"]["unigram_entropy_nats"],
            train_loop_seconds=summary["train_loop_seconds"],
            wall_seconds=summary["wall_seconds"],
            logged_training_losses=losses,
            largest_loss_rise=largest_loss_rise(losses),
        )
        logger.info(
            "%s: validation loss %.4f, %.4f bits/byte",
            run.output_dir,
            summary["eval_loss"],
            summary["bits_per_byte"],
        )
    return result


def validation_tokens_per_byte(summary: dict) -> float:
    """Predicted validation tokens per byte of the text they stand for (the blocks' stats)."""
    from pretrain.summary import tokens_per_byte

    return tokens_per_byte(summary["data"]["splits"]["validation"])


@functools.cache
def course_flops_per_token(tokenizer_dir: str, vocab_size: int) -> float:
    """Training FLOPs per token of the course's GPT-2 117M (1024 positions) with this
    vocabulary, by the formula run_summary.json uses; the weights are never allocated."""
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from pretrain.metrics import flops_per_token
    from pretrain.model import build_model_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = build_model_config("gpt2-117m", tokenizer, 1024, vocab_size=vocab_size)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    return flops_per_token(model, 1024)


SETTINGS_HEADER = ("peak lr", "warmup", "schedule", "beta2", "weight decay", "clip")


def settings_cells(settings: dict[str, Any]) -> list[str]:
    """A recipe's settings as the table shows them, e.g. 1.0e-3 | 5% | cosine to 10%."""
    schedule = settings["schedule"]
    final = f"{settings['final_lr_fraction']:.0%}"
    if schedule in ("cosine", "linear"):
        schedule = f"{schedule} to {final}"
    elif schedule == "wsd":
        schedule = (
            f"constant, then 1-sqrt to {final} over the last {settings['decay_fraction']:.0%}"
        )
    warmup = settings["warmup"]
    return [
        f"{settings['learning_rate']:.1e}".replace("e-0", "e-"),
        f"{warmup * 100:.2g}%" if warmup < 1 else f"{warmup:g} steps",
        schedule,
        f"{settings['adam_beta2']:g}",
        f"{settings['weight_decay']:g}",
        f"{settings['max_grad_norm']:g}",
    ]


def format_table(results: list[dict], compare_vocabularies: bool) -> str:
    """One Markdown row per recipe (and tokenizer): losses per seed, mean, spread, and more."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for result in results:
        groups.setdefault((result["recipe"], result["tokenizer_dir"]), []).append(result)
    header = ["recipe", "validation loss per seed", "mean", "spread", "bits/byte",
              "largest loss rise", *SETTINGS_HEADER]  # fmt: skip
    if compare_vocabularies:
        header[1:1] = ["vocabulary", "bytes/token"]
        header[-len(SETTINGS_HEADER):-len(SETTINGS_HEADER)] = [
            "FLOPs/token", "FLOPs/byte", "117M FLOPs/token", "117M FLOPs/byte", "unigram entropy"
        ]  # fmt: skip
    rows = []
    for (recipe, tokenizer_dir), group in groups.items():
        finished = [result for result in group if not result["failed"]]
        losses = [result["eval_loss"] for result in finished]
        per_seed = ", ".join(
            "failed" if result["failed"] else f"{result['eval_loss']:.3f}" for result in group
        )
        if not finished:
            rows.append([recipe, per_seed] + ["-"] * (len(header) - 2))
            continue
        row = [
            recipe,
            per_seed,
            f"{statistics.mean(losses):.3f}",
            f"{max(losses) - min(losses):.3f}",
            f"{statistics.mean(result['bits_per_byte'] for result in finished):.3f}",
            f"{max(result['largest_loss_rise'] for result in finished):.3f}",
            *settings_cells(finished[0]["recipe_settings"]),
        ]
        if compare_vocabularies:
            first = finished[0]
            bytes_per_token = 1 / first["validation_tokens_per_byte"]
            course_flops = course_flops_per_token(tokenizer_dir, first["vocab_size"])
            row[1:1] = [f"{first['vocab_size']:,}", f"{bytes_per_token:.2f}"]
            row[-len(SETTINGS_HEADER) : -len(SETTINGS_HEADER)] = [
                f"{first['flops_per_token'] / 1e6:.1f}M",
                f"{first['flops_per_token'] / bytes_per_token / 1e6:.2f}M",
                f"{course_flops / 1e6:.0f}M",
                f"{course_flops / bytes_per_token / 1e6:.0f}M",
                f"{first['unigram_entropy_nats']:.3f}",
            ]
        rows.append(row)
    return "\n".join(markdown_table(header, rows))


class ResultsFile:
    """results.json: every run ever recorded in this output folder, rewritten after each run,
    so an interrupted benchmark resumes where it stopped."""

    def __init__(self, path: Path, arguments: RecipeBenchArguments) -> None:
        self.path = path
        self.arguments = dataclasses.asdict(arguments)
        self.runs: dict[str, dict] = {}
        if path.is_file():
            self.runs = {run["run_dir"]: run for run in json.loads(path.read_text())["runs"]}
        self.lock = threading.Lock()

    def record(self, result: dict) -> None:
        with self.lock:
            self.runs[result["run_dir"]] = result
            write_json_atomic(
                self.path, {"arguments": self.arguments, "runs": list(self.runs.values())}
            )


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args([RecipeBenchArguments], argv, description=__doc__, prog="bench/recipes.py")
    runs = plan_runs(args)
    results_file = ResultsFile(Path(args.output_dir) / RESULTS_FILE, args)
    earlier = dict(results_file.runs)
    logger.info(
        "%d runs of %d steps x %d blocks x %d tokens (%s tokens each), %d at a time",
        len(runs),
        args.num_steps,
        args.batch_blocks,
        args.block_size,
        f"{args.num_train_tokens:,}",
        args.num_parallel_runs,
    )

    def train_and_record(run: RunSpec) -> dict:
        result = run_result(args, run, earlier)
        results_file.record(result)
        return result

    with ThreadPoolExecutor(args.num_parallel_runs) as pool:
        results = list(pool.map(train_and_record, runs))
    table = format_table(results, compare_vocabularies=len(args.tokenizer_dirs) > 1)
    Path(args.output_dir, "table.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 1 if any(result["failed"] for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
