"""Train the same GPT-2 under every parallelism strategy and compare them side by side.

    compare-parallelism --output_dir runs/demo/parallelism      # tiny model, 2 CPU processes
    compare-parallelism --device cuda --num_processes 4 --global_batch_size 16 --max_steps 20 \\
        --output_dir runs/parallelism_117m                      # GPT-2 117M on 4 GPUs

Each strategy trains --max_steps steps of the same global batch (--global_batch_size blocks)
from the same random weights, in a subprocess of its own, with the training config and the
pretrain/run.py flags given after `--` (corpus, tokenizer, budget):

  single, ddp, fsdp, zero2, zero3     accelerate launch --config_file accelerate_configs/...
                                      --num_processes P pretrain/run.py (Trainer); the data
                                      parallel ones split the batch, global / P blocks each
  single-loop, tp, pp-gpipe, pp-1f1b  torchrun --standalone --nproc_per_node P -m
                                      pretrain.run_model_parallel (our loop; single-loop is one
                                      process); every process sees the whole batch

All run eagerly with transformers' loss, as our loop does, and with the shipped recipe's
optimizer (Muon for the attention and MLP matrices, AdamW for the rest; `--optimizer adamw`:
AdamW for all), so the rows differ by their parallelism only (on GPUs Trainer trains in bf16,
our loop in fp32). Both loops read the blocks
in the same seeded order and write the same run_summary.json, so every row's loss is compared
with one reference, `single` (pretrain/run.py in one process). Per strategy the table gives
the optimizer, the last step's loss and its difference from the reference, the parameter and
optimizer-state bytes and the peak memory of the process that holds the most, the step time
(the first step left out) and tokens/s.

`--output_dir` receives a run folder and a log per strategy (`<strategy>/`,
`<strategy>.log`), then `parallelism_comparison.md` (the table), `.png` and, last, `.json`. A
strategy that fails is a row with its error, and the command then exits with 1.
"""

import logging
import math
import shlex
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from accelerate.utils.other import get_free_port
from matplotlib.figure import Figure
from transformers.hf_argparser import HfArg

from bench.variants import REPO_ROOT, repo_environment, run_variant
from common.cli import InputError, entry_point, parse_args
from common.files import write_json_atomic
from common.run_contract import (
    PARALLELISM_COMPARISON_FIGURE,
    PARALLELISM_COMPARISON_FILE,
    PARALLELISM_COMPARISON_TABLE,
    PARALLELISM_COMPARISON_VERSION,
)
from common.system import hardware_description, library_versions
from common.values import POSITIVE, at_least
from pretrain.metrics import Span, tokens_per_second
from pretrain.run import parse_pretrain_args
from report.tables import markdown_table

logger = logging.getLogger(__name__)

PRETRAIN_DIR = REPO_ROOT / "pretrain"
ACCELERATE_CONFIG_DIR = REPO_ROOT / "accelerate_configs"
RUN_SCRIPT = PRETRAIN_DIR / "run.py"
DEVICES = ("cpu", "cuda")
DEFAULT_TRAINING_CONFIGS = {
    "cpu": PRETRAIN_DIR / "configs" / "tiny.yaml",
    "cuda": PRETRAIN_DIR / "configs" / "gpt2_117m.yaml",
}


@dataclass(frozen=True)
class StrategySpec:
    """How one strategy is launched and what its summary must then say."""

    name: str
    granted: str  # the strategy its summary reports when it ran as asked
    # Trainer's strategies: their accelerate configs, on cpu and on cuda; our loop's: None.
    accelerate_configs: tuple[str, str] | None = None
    loop_options: tuple[str, ...] = ()  # pretrain.run_model_parallel flags that pick the strategy
    distributed: bool = True  # False: one process

    @property
    def uses_trainer(self) -> bool:
        """Trainer's strategies split the batch (data parallel): global / P blocks each."""
        return self.accelerate_configs is not None


STRATEGY_SPECS = {
    spec.name: spec
    for spec in (
        StrategySpec("single", "single", ("cpu.yaml", "single_gpu.yaml"), distributed=False),
        StrategySpec("ddp", "ddp", ("cpu_ddp.yaml", "multi_gpu_ddp.yaml")),
        StrategySpec("fsdp", "fsdp2", ("cpu_fsdp.yaml", "fsdp.yaml")),
        StrategySpec("zero2", "zero2", ("cpu_deepspeed_zero2.yaml", "deepspeed_zero2.yaml")),
        StrategySpec("zero3", "zero3", ("cpu_deepspeed_zero3.yaml", "deepspeed_zero3.yaml")),
        StrategySpec("single-loop", "single", loop_options=("single",), distributed=False),
        StrategySpec("tp", "tp", loop_options=("tp",)),
        StrategySpec("pp-gpipe", "pp-gpipe", loop_options=("pp", "--pipeline_schedule", "gpipe")),
        StrategySpec("pp-1f1b", "pp-1f1b", loop_options=("pp", "--pipeline_schedule", "1f1b")),
    )
}

# The shipped recipe (Muon for the hidden matrices) without clipping in every row: DeepSpeed
# clips Muon's orthogonalised update, not the gradient, and pretrain/run.py refuses the pair.
OPTIMIZER_FLAGS = {
    "muon": ("--muon", "true", "--max_grad_norm", "0"),
    "adamw": ("--muon", "false"),
}


@dataclass
class ComparisonArguments:
    """What to compare, on what, and the training options every strategy shares."""

    output_dir: str = HfArg(
        help="Folder to create: a run folder and a log per strategy, then "
        "parallelism_comparison.json, .md and .png."
    )
    strategies: list[str] = HfArg(
        default_factory=lambda: list(STRATEGY_SPECS),
        help="Strategies to run (in the order of the choices; single is added).",
        metadata={"choices": list(STRATEGY_SPECS)},
    )
    num_processes: int = HfArg(
        default=2,
        help="Processes (GPUs with --device cuda) per strategy: the strategies split the work.",
        metadata={"range": at_least(2)},
    )
    device: str = HfArg(
        default="cpu",
        help="'cpu': the cpu_*.yaml accelerate configs, fp32, one thread per process; "
        "'cuda': the GPU configs (bf16 under Trainer; our loop trains in fp32).",
        metadata={"choices": DEVICES},
    )
    training_config: str | None = HfArg(
        default=None,
        help="Training YAML for every strategy (default: pretrain/configs/tiny.yaml on "
        "cpu, pretrain/configs/gpt2_117m.yaml on cuda).",
    )
    max_steps: int = HfArg(
        default=16,
        help="Optimizer steps per strategy (within one pass over the budget); the step time "
        "leaves the first out.",
        metadata={"range": at_least(2)},
    )
    global_batch_size: int = HfArg(
        default=16,
        help="Blocks per optimizer step, for every strategy; a multiple of "
        "--num_processes (data parallel splits it). 64 is the course batch of GPT-2 117M.",
    )
    num_microbatches: int | None = HfArg(
        default=None,
        help="Microbatches per step of pp-gpipe and pp-1f1b (default: "
        "pretrain.run_model_parallel's); must divide --global_batch_size.",
    )
    optimizer: str = HfArg(
        default="muon",
        help="'muon': the shipped recipe, Muon for the attention and MLP matrices and AdamW for "
        "the rest, every row without clipping (DeepSpeed would clip Muon's update); 'adamw': "
        "AdamW for every parameter.",
        metadata={"choices": list(OPTIMIZER_FLAGS)},
    )
    timeout_minutes: float = HfArg(
        default=60.0,
        help="Stop a strategy that runs longer and record it as failed.",
        metadata={"range": POSITIVE},
    )
    overwrite: bool = HfArg(default=False, help="Replace an existing --output_dir.")

    def __post_init__(self) -> None:
        if self.global_batch_size % self.num_processes:
            raise InputError(
                f"--global_batch_size {self.global_batch_size} does not split over "
                f"--num_processes {self.num_processes}; pass a multiple of it"
            )
        if self.training_config is None:
            self.training_config = str(DEFAULT_TRAINING_CONFIGS[self.device])
        if not Path(self.training_config).is_file():
            raise InputError(
                f"--training_config {self.training_config} does not exist; pass a training "
                "YAML such as pretrain/configs/tiny.yaml"
            )

    def chosen_strategies(self) -> list[StrategySpec]:
        """The chosen strategies and single (the reference), in the order of STRATEGY_SPECS."""
        wanted = {"single", *self.strategies}
        return [spec for name, spec in STRATEGY_SPECS.items() if name in wanted]


@dataclass
class ComparisonRow:
    """One strategy's result, or its error."""

    strategy: str
    reference: str | None  # single (pretrain/run.py in one process); None on its own row
    command: str
    run_dir: str  # relative to the comparison folder
    num_processes: int
    blocks_per_process: int
    wall_seconds: float
    error: str | None = None
    granted: str | None = None  # the strategy the run reports (accelerate's type for Trainer)
    precision: str | None = None
    optimizer: str | None = None  # as the run's summary records it
    global_batch_tokens: int | None = None
    final_loss: float | None = None
    loss_difference: float | None = None  # final_loss minus the reference's
    parameter_bytes: int | None = None  # the largest over the processes, and so on
    optimizer_state_bytes: int | None = None
    parameter_and_optimizer_bytes: int | None = None
    peak_memory_bytes: int | None = None
    peak_memory_source: str | None = None
    step_seconds: float | None = None
    tokens_per_second: float | None = None

    @property
    def succeeded(self) -> bool:
        return self.error is None


def training_argv(
    args: ComparisonArguments,
    spec: StrategySpec,
    run_dir: Path,
    blocks_per_process: int,
    shared_flags: list[str],
) -> list[str]:
    """The training flags of one strategy: the shared options (the model run as our loop can),
    then what each loop needs to record the last step's loss and to skip unread work."""
    argv = [
        "--config", args.training_config,
        "--output_dir", str(run_dir),
        "--max_steps", str(args.max_steps),
        "--per_device_train_batch_size", str(blocks_per_process),
        "--gradient_accumulation_steps", "1",
        "--torch_compile", "false",
        "--loss_implementation", "hf",
        *OPTIMIZER_FLAGS[args.optimizer],
        "--logging_steps", "1",
        "--save_strategy", "no",
        "--disable_tqdm", "true",
        *shared_flags,
        "--final_loss_window", "1",  # the last step's loss
    ]  # fmt: skip
    if spec.uses_trainer:
        return argv
    if spec.loop_options[0] == "pp" and args.num_microbatches is not None:
        argv += ["--num_microbatches", str(args.num_microbatches)]
    return ["--strategy", *spec.loop_options, *argv]


def launch_command(
    args: ComparisonArguments,
    spec: StrategySpec,
    run_dir: Path,
    num_processes: int,
    blocks_per_process: int,
    shared_flags: list[str],
) -> list[str]:
    """The command line of one strategy, with this interpreter's launchers."""
    training = training_argv(args, spec, run_dir, blocks_per_process, shared_flags)
    if spec.uses_trainer:
        config = ACCELERATE_CONFIG_DIR / spec.accelerate_configs[DEVICES.index(args.device)]
        launcher = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(config), "--num_processes", str(num_processes),
        ]  # fmt: skip
        if spec.distributed:
            launcher += ["--main_process_port", str(get_free_port())]
        return [*launcher, str(RUN_SCRIPT), *training]
    if not spec.distributed:
        return [sys.executable, "-m", "pretrain.run_model_parallel", *training]
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nproc_per_node", str(num_processes),
        "-m", "pretrain.run_model_parallel", *training,
    ]  # fmt: skip


def max_over_ranks(records: list[dict[str, Any]], *keys: str) -> int:
    return max(sum(record[key] for key in keys) for record in records)


def read_summary(row: ComparisonRow, spec: StrategySpec, summary: dict[str, Any]) -> None:
    """Fill `row` from the strategy's run_summary.json (the same file whichever loop trained),
    or set its error when the run was not what was asked."""
    parallelism = summary["parallelism"]
    ranks = parallelism["ranks"]
    row.granted = parallelism["strategy"]
    if row.granted != spec.granted or len(ranks) != row.num_processes:
        row.error = (
            f"asked for {spec.granted} on {row.num_processes} process(es), ran {row.granted} "
            f"on {len(ranks)}"
        )
    row.precision = summary["speed_settings"]["precision"]
    config = summary["config"]
    adamw = config["TrainingArguments"]["optim"]
    row.optimizer = f"Muon + {adamw}" if config["MuonArguments"]["muon"] else adamw
    row.global_batch_tokens = summary["global_batch_tokens"]
    row.final_loss = summary["final_loss"]
    row.parameter_bytes = max_over_ranks(ranks, "parameter_bytes")
    row.optimizer_state_bytes = max_over_ranks(ranks, "optimizer_state_bytes")
    row.parameter_and_optimizer_bytes = max_over_ranks(
        ranks, "parameter_bytes", "optimizer_state_bytes"
    )
    row.peak_memory_bytes = max_over_ranks(ranks, "peak_memory_bytes")
    row.peak_memory_source = ranks[0]["peak_memory_source"]
    steps = summary.get("global_step", 0) - summary.get("resumed_from_step", 0)
    row.tokens_per_second = tokens_per_second(
        Span.AFTER_FIRST_STEP,
        steps * row.global_batch_tokens,
        summary.get("train_loop_seconds"),
        first_step=(row.global_batch_tokens, summary.get("first_step_seconds")),
    )
    # A step after the first (which carries compilation and warm-up) moves one global batch.
    if row.tokens_per_second is not None:
        row.step_seconds = row.global_batch_tokens / row.tokens_per_second


def run_strategy(
    args: ComparisonArguments, spec: StrategySpec, output_dir: Path, shared_flags: list[str]
) -> ComparisonRow:
    """Train one strategy in its run folder under `output_dir`; its row."""
    num_processes = args.num_processes if spec.distributed else 1
    blocks = args.global_batch_size // (num_processes if spec.uses_trainer else 1)
    run_dir = output_dir / spec.name
    command = launch_command(args, spec, run_dir, num_processes, blocks, shared_flags)
    logger.info("%s: %d process(es), %d blocks each", spec.name, num_processes, blocks)
    # On CPU: one thread per process, and DeepSpeed on the CPU (it would pick a GPU that is
    # there but not asked for).
    cpu = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"} if args.device == "cpu" else {}
    outcome = run_variant(command, run_dir, repo_environment(**cpu), args.timeout_minutes * 60)
    row = ComparisonRow(
        strategy=spec.name,
        reference=None if spec.name == "single" else "single",
        command=shlex.join(command),
        run_dir=spec.name,
        num_processes=num_processes,
        blocks_per_process=blocks,
        wall_seconds=outcome.wall_seconds,
        error=outcome.error,
    )
    if outcome.summary is not None:
        read_summary(row, spec, outcome.summary)
    if not row.succeeded:
        logger.error("%s failed: %s", spec.name, row.error)
    return row


def format_bytes(value: float | None) -> str:
    """Binary units, three significant digits or more: 583 KiB, 1.14 MiB, 1010 MiB."""
    if value is None:
        return "-"
    power = min(3, int(math.log(max(value, 1), 1024)))
    value, unit = value / 1024**power, ("B", "KiB", "MiB", "GiB")[power]
    decimals = 0 if unit == "B" or value >= 100 else 1 if value >= 10 else 2
    return f"{value:.{decimals}f} {unit}"


def format_difference(row: ComparisonRow) -> str:
    if row.reference is None:
        return "(reference)" if row.succeeded else "-"
    if row.loss_difference is None:
        return "-"
    return f"{row.loss_difference:+.1e} vs {row.reference}"


def comparison_table(rows: list[ComparisonRow]) -> list[str]:
    """The comparison as a Markdown table, one line per strategy."""
    header = [
        "strategy", "processes", "blocks/process", "precision", "optimizer", "final loss",
        "difference",
        "parameters/process", "optimizer state/process", "peak memory/process", "step time",
        "tokens/s", "result",
    ]  # fmt: skip
    body = [
        [
            row.strategy,
            str(row.num_processes),
            str(row.blocks_per_process),
            row.precision or "-",
            row.optimizer or "-",
            "-" if row.final_loss is None else f"{row.final_loss:.4f}",
            format_difference(row),
            format_bytes(row.parameter_bytes),
            format_bytes(row.optimizer_state_bytes),
            format_bytes(row.peak_memory_bytes),
            "-" if row.step_seconds is None else f"{row.step_seconds * 1000:.0f} ms",
            "-" if row.tokens_per_second is None else f"{row.tokens_per_second:,.0f}",
            "ok" if row.succeeded else "failed: " + row.error.replace("|", "/"),
        ]
        for row in rows
    ]
    return markdown_table(header, body)


def draw_comparison(rows: list[ComparisonRow], path: Path) -> None:
    """Bars per strategy: parameters and optimizer state (stacked), peak memory, tokens/s, each
    for the process that holds or takes the most. A failed strategy keeps its place, empty."""
    positions = range(len(rows))
    mib = 2**20

    def values(attribute: str, scale: float = 1.0) -> list[float]:
        return [(getattr(row, attribute) or 0) / scale for row in rows]

    figure = Figure(figsize=(15, 4.2), dpi=110, layout="constrained")
    axes = figure.subplots(1, 3)
    parameters = values("parameter_bytes", mib)
    axes[0].bar(positions, parameters, label="parameters")
    axes[0].bar(positions, values("optimizer_state_bytes", mib), bottom=parameters,
                label="optimizer state")  # fmt: skip
    axes[0].set(title="parameters + optimizer state per process", ylabel="MiB (largest process)")
    axes[0].legend()
    sources = {row.peak_memory_source for row in rows if row.peak_memory_source}
    axes[1].bar(positions, values("peak_memory_bytes", mib), color="tab:red")
    axes[1].set_title(f"peak memory per process ({', '.join(sorted(sources)) or 'none'})")
    axes[1].set_ylabel("MiB (largest process)")
    axes[2].bar(positions, values("tokens_per_second"), color="tab:green")
    axes[2].set(title="training speed (first step left out)", ylabel="tokens/s")
    for axis in axes:
        axis.set_xticks(list(positions), [row.strategy for row in rows], rotation=40, ha="right")
        for position, row in zip(positions, rows, strict=True):
            if not row.succeeded:
                axis.text(position, 0, "failed", rotation=90, ha="center", va="bottom")
    figure.savefig(path)


def write_comparison(
    args: ComparisonArguments, rows: list[ComparisonRow], output_dir: Path, argv: list[str]
) -> list[str]:
    """Write the JSON, the table and the figure into `output_dir`; the table's lines."""
    table = comparison_table(rows)
    draw_comparison(rows, output_dir / PARALLELISM_COMPARISON_FIGURE)
    (output_dir / PARALLELISM_COMPARISON_TABLE).write_text("\n".join(table) + "\n", "utf-8")
    write_json_atomic(
        output_dir / PARALLELISM_COMPARISON_FILE,
        {
            "comparison_version": PARALLELISM_COMPARISON_VERSION,
            "command": shlex.join(["compare-parallelism", *argv]),
            "rows": [asdict(row) for row in rows],
            "hardware": hardware_description(),
            "versions": library_versions(),
            "config": asdict(args),
        },
    )
    return table


def create_output_dir(path: Path, overwrite: bool) -> None:
    """An empty `path`; an existing one is refused unless `overwrite`, before any training."""
    if path.exists():
        if not overwrite:
            raise InputError(f"output folder {path} already exists; pass --overwrite to replace it")
        shutil.rmtree(path)
    try:
        path.mkdir(parents=True)
    except OSError as err:
        raise InputError(f"cannot create {path}: {err.strerror}") from None


@entry_point
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)  # after --: pretrain/run.py flags
    (args,) = parse_args(
        [ComparisonArguments], argv[:split], description=__doc__, prog="compare-parallelism"
    )
    # The strategies' run folders are written in place, where their summaries say they are;
    # the comparison's JSON comes last, so a folder without it is an unfinished comparison.
    output_dir, flags = Path(args.output_dir), argv[split + 1 :]
    # pretrain/run.py's own parser checks its flags before anything is written or trained.
    spec = STRATEGY_SPECS["single"]
    parse_pretrain_args(training_argv(args, spec, output_dir, args.global_batch_size, flags))
    create_output_dir(output_dir, args.overwrite)
    rows = [run_strategy(args, spec, output_dir, flags) for spec in args.chosen_strategies()]
    for row in rows:  # the loss difference from the first row's, single's, when both finished
        if row.succeeded and rows[0].succeeded:
            row.loss_difference = row.final_loss - rows[0].final_loss
    print("\n".join(write_comparison(args, rows, output_dir, argv)))
    failed = [row.strategy for row in rows if not row.succeeded]
    if failed:
        logger.error("failed: %s (their logs are in %s)", ", ".join(failed), output_dir)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
