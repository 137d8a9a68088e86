"""What our Trainer pipeline costs over a bare PyTorch loop, side by side on CPU.

Both sides train the same GPT-2 (`build_model` of the same preset and tokenizer) on the same
packed blocks (`prepare_blocks` cache), with the same batch, the same optimizer and schedule
(built by Trainer's own `create_optimizer_and_scheduler`: fused AdamW, no weight decay on
biases and norms) and the same gradient clipping, for the same number of steps:

- "trainer": `pretrain.run.main` with the settings of `pretrain/configs/tiny.yaml` (callbacks,
  TensorBoard, logging, final evaluation and save; no checkpoints inside the loop); its wall
  speed is the one the run reports (`tokens_per_second` of run_summary.json, first to last
  step).
- "bare": a plain loop (DataLoader, forward, backward, clip, step, schedule, zero_grad) that
  reads the loss at the steps where Trainer logs it, timed over the same span.

Two measures, each side run alternately `--repeats` times after a warm-up:
- wall tokens/s of the training loop, what users see; on a CPU shared with other jobs it swings
  by +-30% from run to run, so it cannot resolve a few percent;
- tokens per CPU-second, marginal: each side runs `--short_steps` and `--short_steps +
  --num_steps` steps, and the difference of the process CPU time of the two whole runs is the
  cost of `--num_steps` steps; everything that does not grow with the steps (start-up, data
  loading, final evaluation and save) cancels. Other processes barely move CPU time.
Ratios are trainer / bare for runs made one right after the other; the median is printed.

    python bench/overhead_cpu.py [--repeats 6] [--num_steps 40] [--num_threads 1]
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from transformers import Trainer, set_seed

from common.cli import entry_point, parse_args
from common.corpus import CorpusArguments
from common.demo_corpus import write_demo_corpus
from common.run_contract import GPT_SUMMARY_FILE
from common.tokenization import load_tokenizer
from pretrain import run as pretrain_run
from pretrain.batches import collate_blocks
from pretrain.blocks.cache import load_blocks, prepare_blocks
from pretrain.loss import use_chunked_loss
from pretrain.model import build_model, build_model_config
from tokenizer.train import TokenizerArguments, train_tokenizer

logger = logging.getLogger(__name__)

TINY_CONFIG = Path(__file__).resolve().parent.parent / "pretrain" / "configs" / "tiny.yaml"


@dataclass
class OverheadArguments:
    work_dir: str | None = field(
        default=None,
        metadata={"help": "Folder for corpus, tokenizer, cache and runs (default: a temp dir)."},
    )
    num_steps: int = field(
        default=40, metadata={"help": "Steps of a long run beyond those of a short one."}
    )
    short_steps: int = field(default=5, metadata={"help": "Optimizer steps of a short run."})
    block_size: int = field(default=256, metadata={"help": "Tokens per block."})
    batch_size: int = field(default=16, metadata={"help": "Blocks per step."})
    vocab_size: int = field(default=4096, metadata={"help": "Tokenizer vocabulary."})
    repeats: int = field(
        default=6, metadata={"help": "Short + long run pairs of each side, alternating."}
    )
    num_threads: int | None = field(
        default=None, metadata={"help": "torch CPU threads (default: torch's choice)."}
    )


def trainer_argv(args: OverheadArguments, work_dir: Path, run_name: str, num_steps: int):
    """`pretrain/run.py` flags: tiny.yaml, with the bench's data, shape and step count."""
    return [
        "--config", str(TINY_CONFIG),
        "--corpus", str(work_dir / "corpus"),
        "--tokenizer_dir", str(work_dir / "tokenizer"),
        "--cache_dir", str(work_dir / "cache"),
        "--output_dir", str(work_dir / "runs" / run_name),
        "--block_size", str(args.block_size),
        "--per_device_train_batch_size", str(args.batch_size),
        # The budget decides the step count: exactly num_steps full batches.
        "--max_train_tokens", str(num_steps * args.batch_size * args.block_size),
        "--repeat_corpus",
        # Checkpoints write files the bare loop does not; the loop's cost is what is compared.
        "--save_strategy", "no",
    ]  # fmt: skip


def run_trainer(argv: list[str]) -> float:
    """Train through `pretrain/run.py`; return the training loop's tokens/s it reports."""
    exit_code = pretrain_run.main(argv)
    if exit_code != 0:
        raise RuntimeError(f"pretrain/run.py exited with {exit_code}")
    output_dir = Path(argv[argv.index("--output_dir") + 1])
    summary = json.loads((output_dir / GPT_SUMMARY_FILE).read_text())
    return summary["tokens_per_second"]


def run_bare(argv: list[str]) -> float:
    """The same training as `run_trainer(argv)` in a plain PyTorch loop; return tokens/s."""
    model_args, corpus_args, data_args, _, training_args = pretrain_run.parse_pretrain_args(argv)
    set_seed(training_args.seed)
    tokenizer = load_tokenizer(data_args.tokenizer_dir)
    model = build_model(
        build_model_config(
            model_args.model_preset,
            tokenizer,
            data_args.block_size,
            dropout=model_args.dropout,
            attn_implementation=model_args.attn_implementation,
        )
    )
    if model_args.loss_implementation == "chunked":
        use_chunked_loss(model)
    model.train()
    blocks = load_blocks(prepare_blocks(corpus_args, data_args))["train"]
    loader = DataLoader(
        blocks,
        batch_size=training_args.per_device_train_batch_size,
        shuffle=True,
        collate_fn=collate_blocks,
        num_workers=training_args.dataloader_num_workers,
    )
    num_steps = len(loader)
    # Trainer's own optimizer (class, settings, no weight decay on biases and norms) and schedule;
    # the Trainer object itself never trains.
    trainer = Trainer(model=model, args=training_args)
    trainer.create_optimizer_and_scheduler(num_training_steps=num_steps)
    optimizer, scheduler = trainer.optimizer, trainer.lr_scheduler
    tokens_per_step = training_args.per_device_train_batch_size * data_args.block_size
    gc.collect()  # as Trainer does before its loop (accelerator.free_memory)
    start = time.perf_counter()
    for step, batch in enumerate(loader, start=1):
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), training_args.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        # Read the loss where Trainer logs it (a device sync on GPUs).
        if step % training_args.logging_steps == 0 or (
            step == 1 and training_args.logging_first_step
        ):
            loss.item()
    return num_steps * tokens_per_step / (time.perf_counter() - start)


def prepare_inputs(args: OverheadArguments, work_dir: Path) -> None:
    """Demo corpus, a tokenizer trained on it, and the block caches of both run lengths."""
    if not (work_dir / "corpus").exists():
        write_demo_corpus(work_dir / "corpus")
    if not (work_dir / "tokenizer").exists():
        train_tokenizer(
            CorpusArguments(corpus=[str(work_dir / "corpus")]),
            TokenizerArguments(output_dir=str(work_dir / "tokenizer"), vocab_size=args.vocab_size),
            show_progress=False,
        )
    for num_steps in (args.short_steps, args.short_steps + args.num_steps):
        _, corpus_args, data_args, _, _ = pretrain_run.parse_pretrain_args(
            trainer_argv(args, work_dir, "prepare", num_steps)
        )
        prepare_blocks(corpus_args, data_args)


@dataclass
class Measurement:
    """One side's runs: wall tokens/s of the long runs, tokens per marginal CPU-second."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def measure(args: OverheadArguments, work_dir: Path) -> dict[str, Measurement]:
    prepare_inputs(args, work_dir)
    shutil.rmtree(work_dir / "runs", ignore_errors=True)  # run folders of an earlier bench
    runners = {"trainer": run_trainer, "bare": run_bare}
    tokens_per_step = args.batch_size * args.block_size
    # Warm-up: touches every code path once and settles the allocator.
    for name, runner in runners.items():
        runner(trainer_argv(args, work_dir, f"warmup-{name}", args.short_steps))
    results = {name: Measurement() for name in runners}
    for repeat in range(args.repeats):
        for name, runner in runners.items():
            cpu_seconds = {}
            for num_steps in (args.short_steps, args.short_steps + args.num_steps):
                argv = trainer_argv(args, work_dir, f"{name}-{repeat}-{num_steps}", num_steps)
                cpu_start = time.process_time()
                wall = runner(argv)
                cpu_seconds[num_steps] = time.process_time() - cpu_start
            marginal = cpu_seconds[max(cpu_seconds)] - cpu_seconds[min(cpu_seconds)]
            results[name].wall.append(wall)
            results[name].cpu.append(args.num_steps * tokens_per_step / marginal)
            logger.info(
                "repeat %d %s: %.0f tokens/s wall, %.0f tokens per CPU-second",
                repeat,
                name,
                results[name].wall[-1],
                results[name].cpu[-1],
            )
    return results


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args(
        [OverheadArguments],
        argv,
        description=__doc__,
        prog="bench/overhead_cpu.py",
    )
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    if args.work_dir is None:
        with tempfile.TemporaryDirectory(prefix="overhead_cpu-") as tmp:
            results = measure(args, Path(tmp))
    else:
        results = measure(args, Path(args.work_dir))
    print(
        f"tiny GPT-2, {args.batch_size} x {args.block_size} tokens per step, runs of "
        f"{args.short_steps} and {args.short_steps + args.num_steps} steps, {args.repeats} "
        f"alternating repeats, {torch.get_num_threads()} torch threads"
    )
    for label, attribute in (
        ("tokens/s, wall, training loop", "wall"),
        ("tokens per CPU-second, marginal", "cpu"),
    ):
        trainer, bare = getattr(results["trainer"], attribute), getattr(results["bare"], attribute)
        ratios = [t / b for t, b in zip(trainer, bare, strict=True)]
        print(f"{label}:")
        print("  trainer " + ", ".join(f"{v:,.0f}" for v in trainer))
        print("  bare    " + ", ".join(f"{v:,.0f}" for v in bare))
        print(
            "  ratio trainer/bare "
            + ", ".join(f"{r:.3f}" for r in ratios)
            + f"; median {statistics.median(ratios):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
