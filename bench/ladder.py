"""The scaling ladder: the shipped recipe at growing GPT-2 shapes, a fit, GPT-2 117M predicted.

A rung is a shape "LxD" (L layers, D wide, heads of 64) trained with gpt2_117m.yaml as shipped
(the `course` recipe) as rows of bench/compare_recipes.py: its PROXY_FLAGS, then the flags after
`--` (the corpus: the same held-out blocks for every rung), every seed. Every rung takes the
course's optimizer steps and tokens per parameter, embeddings counted (12,058,624 tokens into
GPT-2 117M with a 32,768 vocabulary: 0.109): its batch is round(tokens per parameter x its
parameters / steps / block size) blocks, at least 1. After the table (also in
`<output_dir>/table.md`), the fit L(N) = E + A N^-alpha of the final validation loss over the
non-embedding parameters N (scipy.optimize.curve_fit, every seed's loss); the largest rung
predicted from the others (error e); GPT-2 117M's loss (N of 12 x 768) from all rungs, +- h.
The rule: h = |e| x max(1, log(N_117M / N_largest) / log(N_largest / N_next)), the left-out
error scaled by how much further in log N the extrapolation reaches, and h is at least the
largest spread between a rung's seeds. The loss is on the ladder's corpus and vocabulary.

    python -m bench.ladder --tokenizer_dir runs/bench/ladder-tokenizer-8192 \\
        --num_parallel_runs 2 -- --corpus runs/bench/ladder_corpus/docstrings.txt
"""

from __future__ import annotations

import math
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from transformers.hf_argparser import HfArg

from bench.compare_recipes import BASE_CONFIG, PROXY_FLAGS, RecipeBenchArguments, plan_runs, train
from common.cli import InputError, entry_point, parse_args
from common.values import POSITIVE, at_least
from report.tables import markdown_table


@dataclass
class LadderArguments:
    tokenizer_dir: str = HfArg(help="Tokenizer folder of every run (train-tokenizer's output).")
    shapes: list[str] = HfArg(
        default_factory=lambda: ["2x128", "4x128", "5x192", "6x256", "8x320"],
        help="Rungs: GPT-2 shapes LxD (L layers, D wide, a multiple of 64), smallest first.",
    )
    seeds: list[int] = HfArg(default_factory=lambda: [0, 1], help="Training seeds of every rung.")
    output_dir: str = HfArg(default="runs/bench/ladder", help="Folder for table.md and the runs.")
    tokens_per_parameter: float | None = HfArg(
        default=None,
        help="Training tokens per parameter (embeddings counted) of every rung. Default: the "
        "course's, its tokens over GPT-2 117M's parameters with a 32,768 vocabulary.",
        metadata={"range": POSITIVE},
    )
    steps: int | None = HfArg(
        default=None,
        help="Optimizer steps of every rung. Default: the course's (184).",
        metadata={"range": at_least(1)},
    )
    block_size: int = HfArg(
        default=1024, help="Tokens per block (the course's 1024).", metadata={"range": at_least(1)}
    )
    num_threads: int = HfArg(
        default=1,
        help="Torch threads per run: 1 keeps each seed's losses exactly repeatable.",
        metadata={"range": at_least(1)},
    )
    num_parallel_runs: int = HfArg(
        default=1, help="Runs at a time.", metadata={"range": at_least(1)}
    )
    dry_run: bool = HfArg(default=False, help="Print the plan (no results) and train nothing.")

    def __post_init__(self) -> None:
        if len(set(self.shapes)) < 4 or not self.seeds:  # a fit of 3 parameters, one left out
            raise InputError(
                f"--shapes {' '.join(self.shapes)}: the fit needs at least 4 distinct shapes and "
                "a seed; give 4 or more shapes"
            )


@dataclass(frozen=True)
class Rung:
    shape: str
    non_embedding: int  # Kaplan et al.'s N: neither token nor position embeddings
    total: int
    batch: int  # blocks per optimizer step
    steps: int
    tokens: int


class LadderFit(NamedTuple):
    e: float
    a: float
    alpha: float
    largest: int  # N of the rung left out
    left_out_predicted: float
    left_out_measured: float  # its seeds' mean
    prediction: float  # at the course model's N
    half_width: float


def course_budget() -> tuple[int, int]:
    """The course run's optimizer steps and tokens: its budget in whole batches, as it rounds it."""
    from pretrain.args import budget_in_whole_batches
    from pretrain.run import parse_pretrain_args

    args = parse_pretrain_args(["--config", str(BASE_CONFIG)])
    batch_tokens = args.training.global_batch_blocks * args.data.block_size
    tokens = budget_in_whole_batches(args, args.training.global_batch_blocks).max_train_tokens
    return tokens // batch_tokens, tokens


def parameter_counts(flags: list[str], tokenizer) -> tuple[int, int]:
    """(non-embedding, total) parameters of the model pretrain/run.py builds from `flags`, on the
    meta device: no weights are allocated."""
    import torch
    from transformers import GPT2LMHeadModel

    from pretrain.run import parse_pretrain_args

    args = parse_pretrain_args(["--config", str(BASE_CONFIG), *flags])
    with torch.device("meta"):
        model = GPT2LMHeadModel(args.model.model_config(tokenizer, args.data.block_size))
    embeddings = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
    return model.num_parameters() - embeddings, model.num_parameters()


def plan_rungs(args: LadderArguments, shared_flags: list[str]) -> tuple[list[Rung], int, str]:
    """Every rung's size and budget; GPT-2 117M's non-embedding parameters; the plan in words."""
    from transformers import AutoTokenizer

    from pretrain.check_gpu import COURSE_VOCAB_SIZE  # train-tokenizer's default

    if not Path(args.tokenizer_dir).is_dir():
        raise InputError(f"tokenizer folder {args.tokenizer_dir} does not exist")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    course_steps, course_tokens = course_budget()
    course_n, course_total = parameter_counts(["--vocab_size", str(COURSE_VOCAB_SIZE)], tokenizer)
    per_parameter = args.tokens_per_parameter or course_tokens / course_total
    steps = args.steps or course_steps
    rungs = []
    for shape in args.shapes:
        # The flags of the rung's runs, so that a --vocab_size after `--` counts here too.
        shape_flags = ["--model_preset", shape, "--block_size", str(args.block_size)]
        n, total = parameter_counts([*PROXY_FLAGS, *shared_flags, *shape_flags], tokenizer)
        batch = max(1, round(per_parameter * total / steps / args.block_size))
        rungs.append(Rung(shape, n, total, batch, steps, steps * batch * args.block_size))
    words = (
        f"{per_parameter:.4f} tokens per parameter (GPT-2 117M: {course_tokens:,} tokens, "
        f"{course_total:,} parameters, {course_n:,} without embeddings), {steps} steps."
    )
    return rungs, course_n, words


def rung_row(rung: Rung, block_size: int) -> str:
    """The rung as a compare_recipes row: the course recipe, this shape and its budget."""
    return (
        f"course --model_preset {rung.shape} --block_size {block_size} "
        f"--per_device_train_batch_size {rung.batch} --gradient_accumulation_steps 1 "
        f"--max_train_tokens {rung.tokens}"
    )


def format_table(rungs: list[Rung], results: list[list[dict | None]]) -> str:
    """One row per rung; a dry run's (no results) shows the plan alone."""
    header = ["shape", "non-embedding params", "total params", "tokens", "batch", "steps",
              "seconds per seed", "validation loss per seed", "mean"]  # fmt: skip
    rows = []
    for rung, group in zip(rungs, results, strict=True):
        losses = [result["eval_loss"] for result in group if result is not None]

        def per_seed(key: str, digits: int, group=group) -> str:
            cells = ["failed" if r is None else f"{r[key]:.{digits}f}" for r in group]
            return ", ".join(cells) or "-"

        rows.append([
            rung.shape, f"{rung.non_embedding:,}", f"{rung.total:,}", f"{rung.tokens:,}",
            str(rung.batch), str(rung.steps), per_seed("wall_seconds", 0),
            per_seed("eval_loss", 3), f"{statistics.mean(losses):.3f}" if losses else "-",
        ])  # fmt: skip
    return "\n".join(markdown_table(header, rows))


def power_law(n, e: float, a: float, alpha: float):
    return e + a * n**-alpha


def fit_power_law(n, loss) -> tuple[float, float, float]:
    """E, A, alpha of L(N) = E + A N^-alpha, bounded least squares (scipy's curve_fit): the loss
    falls with N (A >= 0, 0 < alpha <= 2) towards a floor E between 0 and the lowest loss."""
    import numpy as np
    from scipy.optimize import curve_fit

    n, loss = np.asarray(n, dtype=float), np.asarray(loss, dtype=float)
    scale, lowest = n.min(), loss.min()  # N in units of the smallest rung: A near the losses
    start = (lowest / 2, loss.max() - lowest / 2, 0.3)
    bounds = ([0.0, 0.0, 1e-3], [lowest, np.inf, 2.0])
    (e, a, alpha), _ = curve_fit(power_law, n / scale, loss, p0=start, bounds=bounds)
    return float(e), float(a * scale**alpha), float(alpha)


def ladder_fit(points: list[tuple[int, float]], course_n: int) -> LadderFit:
    """The fit over every (N, loss), the largest N predicted from the others, and the course
    model's loss with the module docstring's interval; needs 4 distinct N (3 left to fit)."""
    sizes = sorted({n for n, _ in points})
    if len(sizes) < 4:
        raise ValueError(f"the fit needs at least 4 rungs with a result, not {len(sizes)}")
    e, a, alpha = fit_power_law(*zip(*points, strict=True))
    largest, next_largest = sizes[-1], sizes[-2]
    rest = [(n, loss) for n, loss in points if n < largest]
    left_out = power_law(largest, *fit_power_law(*zip(*rest, strict=True)))
    measured = statistics.mean(loss for n, loss in points if n == largest)
    # How much further, in log N, the extrapolation reaches than the leave-one-out did.
    reach = max(1.0, math.log(course_n / largest) / math.log(largest / next_largest))
    seeds = [[loss for m, loss in points if m == n] for n in sizes]
    spread = max(max(losses) - min(losses) for losses in seeds)
    half_width = max(abs(left_out - measured) * reach, spread)
    prediction = power_law(course_n, e, a, alpha)
    return LadderFit(e, a, alpha, largest, left_out, measured, prediction, half_width)


def fit_text(rungs: list[Rung], results: list[list[dict | None]], course_n: int) -> str:
    points = [(rung.non_embedding, result["eval_loss"])
              for rung, group in zip(rungs, results, strict=True)
              for result in group if result is not None]  # fmt: skip
    try:
        fit = ladder_fit(points, course_n)
    except (ValueError, RuntimeError) as err:  # too few rungs; curve_fit did not converge
        return f"No fit: {err}."
    shape = next(rung.shape for rung in rungs if rung.non_embedding == fit.largest)
    return (
        f"Fit (scipy.optimize.curve_fit, every seed's loss) over non-embedding parameters N: "
        f"L(N) = {fit.e:.3f} + {fit.a:.4g} N^-{fit.alpha:.3f}.\n\n"
        f"Leave the largest rung out: {shape} ({fit.largest:,}) predicted "
        f"{fit.left_out_predicted:.3f} from the others, measured {fit.left_out_measured:.3f} "
        f"(error {fit.left_out_predicted - fit.left_out_measured:+.3f}).\n\n"
        f"GPT-2 117M (12 x 768, N = {course_n:,}): {fit.prediction:.3f} +- {fit.half_width:.3f} "
        "nats per token on this corpus and vocabulary (the interval: bench/ladder.py's docstring)."
    )


@entry_point
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)  # after --: every run's flags
    prog = "python -m bench.ladder"
    (args,) = parse_args([LadderArguments], argv[:split], description=__doc__, prog=prog)
    shared_flags = argv[split + 1 :]
    rungs, course_n, plan = plan_rungs(args, shared_flags)
    rows = [rung_row(rung, args.block_size) for rung in rungs]
    recipe_args = RecipeBenchArguments([args.tokenizer_dir], rows, args.seeds, args.output_dir)
    runs = plan_runs(recipe_args, shared_flags)  # every run's flags checked before any trains
    if args.dry_run:
        print(format_table(rungs, [[] for _ in rungs]) + "\n\n" + plan)
        return 0
    with ThreadPoolExecutor(args.num_parallel_runs) as pool:
        # Largest rungs first: the long runs start early, the short ones fill the gaps.
        flat = list(pool.map(lambda run: train(run, args.num_threads), runs[::-1]))[::-1]
    results = [flat[i : i + len(args.seeds)] for i in range(0, len(flat), len(args.seeds))]
    text = "\n\n".join([format_table(rungs, results), plan, fit_text(rungs, results, course_n)])
    Path(args.output_dir, "table.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 1 if any(None in group for group in results) else 0


if __name__ == "__main__":
    sys.exit(main())
