"""Where every speed and size a run reports comes from: the loop's clock (tokens/s, first
step), MFU, the GPU's readings and `nvidia-smi` snapshot, and what each process holds.

The callbacks act only at Trainer's logging steps, where it synchronises with the device anyway;
every GPU function is a no-op without an NVIDIA GPU. Sizes count each process's local shard
(DTensor, ZeRO-3 partition). Peak memory on CPU is the whole process's resident set: compare it
between strategies, not with parameters.
"""

import logging
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from accelerate.utils import gather_object
from torch import nn
from torch.utils.tensorboard import SummaryWriter
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    PrinterCallback,
    ProgressCallback,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)
from transformers.integrations import TensorBoardCallback

from common.cli import InputError
from common.run_contract import (
    GPT_TIME_BUDGET_PARTS,
    GPU_MEMORY_USED,
    GPU_POWER,
    GPU_UTILIZATION,
    MFU,
    TIME_CHECKPOINT_SAVES,
    TIME_FIRST_STEP,
    TIME_IMPORTS,
    TIME_LOOP_SETUP,
    TIME_OTHER,
    TIME_STEPS,
    TOKENS_PER_SECOND,
    elapsed_and_left,
)
from pretrain.args import PretrainArguments
from pretrain.loss import DEFAULT_CHUNK_SIZE
from pretrain.model import num_matmul_parameters
from pretrain.parallel.strategy import local_tensor
from pretrain.plan import RunPlan, RunSetup

logger = logging.getLogger(__name__)

# --- FLOPs and the devices' peak ------------------------------------------------------------


ACTIVATION_BYTES = 37  # kept for backward per token, layer and unit of width (docs/BENCHMARKS.md)
STATE_BYTES_PER_PARAMETER = 4 + 4 + 8 + 2  # fp32 weights, gradients, 2 AdamW moments; bf16 copy
# The share of a matmul rate a training step is assumed to reach (attention, elementwise work,
# the optimizer between the matmuls), until a GPU run measures it. On a CPU, of fp32's: 0.25,
# measured (a 4 x 256 GPT-2, blocks of 256, on 2 cores: 0.247).
UTILISATION = 0.4
CPU_UTILISATION = 0.25
# Training FLOPs past which a CPU run is worth the estimate's half second (about a minute here).
CPU_ESTIMATE_FLOPS = 1e13


def memory_estimate(args: PretrainArguments, model: GPT2LMHeadModel, batch: int) -> list[float]:
    """Bytes of weights, gradients and AdamW; activations; the loss, at `batch` blocks a device."""
    config, tokens = model.config, batch * args.data.block_size
    # The loss: one chunk's fp32 logits and softmax at a time; else transformers' keeps every
    # fp32 logit for backward, then their fp32 and bf16 gradients.
    chunked = args.model.loss_implementation == "chunked"
    loss = (min(tokens, DEFAULT_CHUNK_SIZE) * 8 if chunked else tokens * 10) * config.vocab_size
    activations = ACTIVATION_BYTES * config.n_layer * config.n_embd * tokens
    return [STATE_BYTES_PER_PARAMETER * model.num_parameters(), activations, loss]


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, size: int) -> float:
    """TFLOP/s of a `size` x `size` matmul, by torch's timer (it warms up, syncs the GPU)."""
    from torch.utils.benchmark import Timer  # here: its import warns on machines without CUDA

    a, b = torch.randn(2, size, size, device=device, dtype=dtype)
    seconds = Timer("a @ b", globals={"a": a, "b": b}).blocked_autorange(min_run_time=0.5).median
    return 2 * size**3 / seconds / 1e12


def predicted_loop_seconds(
    tokens: int, model: GPT2LMHeadModel, block_size: int, tflops: float, share: float = UTILISATION
) -> float:
    """The training FLOPs of `tokens` at `share` of a matmul rate of `tflops`."""
    return tokens * flops_per_token(model, block_size) / (tflops * 1e12 * share)


def cpu_run_estimate(args: PretrainArguments, model: GPT2LMHeadModel, tokens: int) -> str | None:
    """Before a long CPU run, in one line: its first step's memory against what is free now and
    its loop's time from an fp32 matmul timed here; None for a short one (the timing is skipped)."""
    block_size = args.data.block_size
    if tokens * flops_per_token(model, block_size) < CPU_ESTIMATE_FLOPS:
        return None
    needed, free = first_step_memory(args, model)
    tflops = measure_matmul_tflops(torch.device("cpu"), torch.float32, 1024)
    hours = predicted_loop_seconds(tokens, model, block_size, tflops, CPU_UTILISATION) / 3600
    return (
        f"on the CPU, the first step needs about {needed / 2**30:.1f} GiB "
        f"({free / 2**30:.1f} GiB free now) and the loop about "
        f"{hours:,.1f} hours ({tokens:,} tokens at {CPU_UTILISATION:g} of the {tflops:.2f} TFLOP/s "
        "of an fp32 matmul timed here); a GPU: check-gpu"
    )


def first_step_memory(args: PretrainArguments, model: GPT2LMHeadModel) -> tuple[float, int]:
    """The bytes a CPU run's first step needs (check-gpu's estimate) and the bytes free now."""
    batch = args.training.per_device_train_batch_size
    return sum(memory_estimate(args, model, batch)), psutil.virtual_memory().available


def refuse_cpu_run_over_free_memory(args: PretrainArguments, config: GPT2Config) -> None:
    """Before a CPU run prepares its data: a first step that needs more memory than is free
    now stops in one line, where the out-of-memory killer would end it without one."""
    with torch.device("meta"):  # the shapes alone
        needed, free = first_step_memory(args, GPT2LMHeadModel(config))
    if needed > free and args.training.check_free_memory:
        raise InputError(
            f"on the CPU, the first step needs about {needed / 2**30:.1f} GiB and "
            f"{free / 2**30:.1f} GiB is free: train a config that fits "
            "(pretrain/configs/tiny.yaml) or a smaller --per_device_train_batch_size, or pass "
            "--check_free_memory false to start it anyway"
        )


def flops_per_token(model: GPT2LMHeadModel, sequence_length: int) -> float:
    """Training FLOPs per token, PaLM's appendix B: 6 N + 12 L d T, N the parameters in matmuls
    (the tied embedding once: the output layer multiplies by it), L layers, d the width, T the
    sequence length (the full attention square, as is customary)."""
    config = model.config
    return 6 * num_matmul_parameters(model) + 12 * config.n_layer * config.n_embd * sequence_length


# Dense 16-bit tensor-core peak with FP32 accumulation, TFLOP/s (datasheets); MFU is against it
# whatever the precision (PaLM, nanoGPT). A name matches an entry holding all its words; the
# first match wins, so variants come before the plain name.
PEAK_TFLOPS_16BIT: tuple[tuple[tuple[str, ...], float], ...] = (
    (("B200",), 2250.0), (("GH200",), 989.0), (("H200", "NVL"), 835.0), (("H200",), 989.0),
    (("H100", "PCIe"), 756.0), (("H100", "NVL"), 835.0), (("H100",), 989.0), (("H800",), 989.0),
    (("A100",), 312.0), (("A800",), 312.0),
    (("L40S",), 362.0), (("L40",), 181.0), (("L4",), 121.0), (("A10",), 125.0),
    (("A6000",), 154.8), (("4090",), 165.2), (("3090",), 71.0),
    # GeForce Turing runs FP16 with FP32 accumulation at half the Quadro/Titan rate.
    (("2080", "Ti"), 53.8), (("V100",), 125.0), (("T4",), 65.0),
)  # fmt: skip


def accelerator_name(device: torch.device) -> str:
    """The accelerator's marketing name ("NVIDIA H200"), or the device type ("cpu")."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def job_peak_flops_per_second(
    peak_tflops: float | None, device: torch.device, num_devices: int
) -> float | None:
    """The job's peak FLOP/s: one device's (`peak_tflops`, else by its name) times the devices."""
    one_device = (
        peak_tflops * 1e12 if peak_tflops else peak_flops_per_second(accelerator_name(device))
    )
    return None if one_device is None else one_device * num_devices


def peak_flops_per_second(device_name: str) -> float | None:
    """Dense 16-bit peak FLOP/s of a GPU named like `torch.cuda.get_device_name()`, or None."""
    words = set(re.split(r"[\s\-_]+", device_name))
    for required, tflops in PEAK_TFLOPS_16BIT:
        if all(word in words for word in required):
            return tflops * 1e12
    return None


class Span(Enum):
    """What a tokens/s figure covers: each caller of `tokens_per_second` names its span."""

    WHOLE_LOOP = "whole_loop"  # this session's loop, first step included (run_summary.json)
    WINDOW = "window"  # one logging window (TensorBoard's perf/tokens_per_second)
    AFTER_FIRST_STEP = "after_first_step"  # the loop less its first step (compilation, warm-up)


def tokens_per_second(
    span: Span, tokens: int, seconds: float | None, first_step: tuple[int, float | None] = (0, None)
) -> float | None:
    """Training tokens per second over `span`: `tokens` in `seconds`, for AFTER_FIRST_STEP less
    the first step's (its tokens, its seconds); None without tokens or seconds."""
    if span is Span.AFTER_FIRST_STEP:
        first_tokens, first_seconds = first_step
        if first_seconds is None or seconds is None:
            return None
        tokens, seconds = tokens - first_tokens, seconds - first_seconds
    return tokens / seconds if tokens > 0 and seconds and seconds > 0 else None


def model_flops_utilization(
    tokens_per_second: float | None, flops_per_token: float, peak_flops_per_second: float | None
) -> float | None:
    """The training FLOP/s over the devices' peak; None without a speed or a known peak (CPU)."""
    if tokens_per_second is None or peak_flops_per_second is None:
        return None
    return tokens_per_second * flops_per_token / peak_flops_per_second


# --- The GPU's readings ----------------------------------------------------------------------


class GpuReadings:
    """Utilisation, memory in use and power draw of one CUDA device (through torch's NVML
    calls), keyed by TensorBoard tag; the first failed reading says so once and stops them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device if device.type == "cuda" else None

    def read(self) -> dict[str, float]:
        if self.device is None:
            return {}
        try:
            free_bytes, total_bytes = torch.cuda.mem_get_info(self.device)
            return {
                GPU_UTILIZATION: float(torch.cuda.utilization(self.device)),
                GPU_MEMORY_USED: (total_bytes - free_bytes) / 2**30,
                GPU_POWER: torch.cuda.power_draw(self.device) / 1000.0,
            }
        except Exception as err:  # noqa: BLE001 (no NVML library, or a driver too old for it)
            logger.warning("GPU readings stopped: %s", err)
            self.device = None
            return {}


def write_nvidia_smi_snapshot(path: Path) -> bool:
    """Save the output of `nvidia-smi` to `path`; False (nothing written) without one."""
    executable = shutil.which("nvidia-smi")
    if executable is None or not torch.cuda.is_available():
        return False
    try:
        result = subprocess.run(
            [executable], capture_output=True, text=True, timeout=30, check=True
        )
    except (subprocess.SubprocessError, OSError) as err:
        logger.warning("nvidia-smi snapshot failed: %s", err)
        return False
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(result.stdout, encoding="utf-8")
    partial.replace(path)
    return True


# --- What each process holds -----------------------------------------------------------------


def rank_footprint(
    model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> dict[str, Any]:
    """This process's record: rank, parameter and optimizer-state bytes, peak memory."""
    peak_bytes, peak_source = peak_memory(device)
    return {
        "rank": dist.get_rank() if dist.is_initialized() else 0,
        "parameter_bytes": parameter_bytes(model.parameters()),
        "optimizer_state_bytes": optimizer_state_bytes(optimizer, model),
        "peak_memory_bytes": peak_bytes,
        "peak_memory_source": peak_source,
    }


def parameter_bytes(parameters: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct parameters (a tied weight once), local parts only."""
    distinct = {id(parameter): parameter for parameter in parameters}
    return sum(local_tensor(parameter).nbytes for parameter in distinct.values())


def optimizer_state_bytes(optimizer: Any, model: nn.Module) -> int:
    """Bytes of the optimizer's per-parameter state and of the parameters it updates that are
    not `model`'s (master copies, flat partitions), local parts only."""
    # The torch optimizer inside wrappers (accelerate's AcceleratedOptimizer, DeepSpeed's ZeRO
    # optimizer), each of which keeps the one it wraps as `.optimizer`.
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    state = [v for per_parameter in optimizer.state.values() for v in per_parameter.values()]
    ours = {id(parameter) for parameter in model.parameters()}
    copies = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in ours]
    return sum(local_tensor(v).nbytes for v in state if torch.is_tensor(v)) + parameter_bytes(
        copies
    )


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Peak bytes of this process on `device`, and how they were measured."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kibibytes, macOS bytes.
    return (peak if sys.platform == "darwin" else peak * 1024), "process_max_rss"


# --- The loop's clock and the callbacks that feed TensorBoard ------------------------------


LOOP = "loop"  # the phase LoopClock times, split into first step, saves and steps


class TimeBudget:
    """Where a run's wall seconds go from the process launch: phases timed back to back (`lap`),
    the loop split into its first step, its checkpoint saves and its other steps."""

    def __init__(self, launched_at: float | None = None) -> None:
        self.launched_at = self._last = launched_at or psutil.Process().create_time()
        self.phases: dict[str, float] = {}
        # Graphs dynamo had compiled in this process when the loop started, after its first step.
        self.graphs_at_loop_start = self.graphs_after_first_step = 0
        self.lap(TIME_IMPORTS)

    def lap(self, phase: str) -> None:
        now = time.time()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def seconds(
        self, wall_seconds: float, first_step_seconds: float | None, save_seconds: float
    ) -> dict[str, float]:
        """Seconds per part of `GPT_TIME_BUDGET_PARTS`, in its order, summing to `wall_seconds`."""
        phases = dict(self.phases)
        loop = phases.pop(LOOP, 0.0)
        if first_step_seconds is not None:
            phases[TIME_FIRST_STEP] = first_step_seconds
            phases[TIME_CHECKPOINT_SAVES] = save_seconds
            phases[TIME_STEPS] = loop - first_step_seconds - save_seconds
        phases[TIME_OTHER] = phases.get(TIME_OTHER, 0.0) + wall_seconds - sum(phases.values())
        return {name: round(phases[name], 3) for name in GPT_TIME_BUDGET_PARTS if name in phases}

    def compile_counts(self) -> dict[str, int]:
        """Graphs dynamo compiled in the loop's first step, and after it (recompiles: a new
        shape, a no-grad evaluation), up to now."""
        return {
            "compiles": self.graphs_after_first_step - self.graphs_at_loop_start,
            "recompiles": graphs_compiled() - self.graphs_after_first_step,
        }


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class LoopClock:
    """Times either training loop: the whole loop, its first step, each logging window's
    scalars (`window`); one `nvidia-smi` snapshot halfway, and at `stop` (every process, after
    an optimizer step) what each process holds (`ranks`, in rank order)."""

    def __init__(
        self,
        plan: RunPlan,
        setup: RunSetup,
        device: torch.device,
        snapshot_path: Path,
        budget: TimeBudget,
    ) -> None:
        self.budget = budget
        self.schedule, self.setup = plan.schedule, setup
        self.device = device
        self.snapshot_path: Path | None = snapshot_path  # None once the snapshot is taken
        self.gpu = GpuReadings(device)
        self.loop_start = 0.0  # set by `start`, which both loops call first
        self.loop_seconds: float | None = None
        self.first_step_seconds: float | None = None
        self.ranks: list[dict[str, Any]] = []
        self._window_start = 0.0
        self._window_step = self.start_step = 0

    def start(self, step: int) -> None:
        self.budget.lap(TIME_LOOP_SETUP)
        self.budget.graphs_at_loop_start = graphs_compiled()
        self.loop_start = self._window_start = time.perf_counter()
        self._window_step = self.start_step = step

    def step_done(self) -> None:
        if self.first_step_seconds is None:
            self.first_step_seconds = time.perf_counter() - self.loop_start
            self.budget.graphs_after_first_step = graphs_compiled()

    def window(self, step: int) -> dict[str, float]:
        """The scalars of the logging window that ends at `step` (empty when nothing new)."""
        if step <= self._window_step:
            return {}
        now = time.perf_counter()
        tokens = self.schedule.tokens_between(self._window_step, step)
        speed = tokens_per_second(Span.WINDOW, tokens, now - self._window_start)
        self._window_start, self._window_step = now, step
        scalars = {TOKENS_PER_SECOND: speed, **self.gpu.read()}
        mfu = model_flops_utilization(
            speed, self.setup.flops_per_token, self.setup.peak_flops_per_second
        )
        if mfu is not None:
            scalars[MFU] = mfu
        if self.snapshot_path is not None and step >= self.schedule.max_steps // 2:
            write_nvidia_smi_snapshot(self.snapshot_path)
            self.snapshot_path = None
        return scalars

    def progress_line(
        self, step: int, loss: float, learning_rate: float, scalars: dict[str, float]
    ) -> str:
        """What both loops log at a logging step, from its `window` scalars: `step 16/184: loss
        6.5630, lr 9.6e-04, 41,200 tokens/s, mfu 31%, 2m10s elapsed, 14m40s left` (MFU where
        the peak is known; the time left at this session's pace)."""
        max_steps = self.schedule.max_steps
        parts = [f"step {step}/{max_steps}: loss {loss:.4f}", f"lr {learning_rate:.1e}"]
        if scalars.get(TOKENS_PER_SECOND) is not None:
            parts.append(f"{scalars[TOKENS_PER_SECOND]:,.0f} tokens/s")
        if MFU in scalars:
            parts.append(f"mfu {scalars[MFU]:.0%}")
        elapsed = time.perf_counter() - self.loop_start
        parts.append(elapsed_and_left(elapsed, step - self.start_step, max_steps - self.start_step))
        return ", ".join(parts)

    def stop(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """End the loop's time and gather every process's footprint, before the final save and
        the evaluation gather sharded weights."""
        self.loop_seconds = time.perf_counter() - self.loop_start
        self.budget.lap(LOOP)
        self.ranks = gather_object([rank_footprint(model, optimizer, self.device)])


class ThroughputCallback(TrainerCallback):
    """`LoopClock` in Trainer's loop: its window scalars go to Trainer's TensorBoard writer, its
    progress line to the log (rank 0)."""

    def __init__(self, tensorboard: TensorBoardCallback | None, clock: LoopClock) -> None:
        self.tensorboard = tensorboard
        self.clock = clock

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        self.clock.start(state.global_step)

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        self.clock.step_done()

    def on_log(self, args, state: TrainerState, control: TrainerControl, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return  # evaluation or end-of-training summaries
        step = state.global_step
        scalars = self.clock.window(step)
        if not state.is_world_process_zero:
            return
        logger.info(self.clock.progress_line(step, logs["loss"], logs["learning_rate"], scalars))
        writer = self.tensorboard.tb_writer if self.tensorboard else None
        if writer is not None:
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, step)

    def on_train_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.clock.stop(model, optimizer)


class ProgressBar(ProgressCallback):
    """Trainer's progress bar (a terminal's) without its dict of logs: our line says them."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def clock_trainer(trainer: Trainer, clock: LoopClock, log_dir: Path, start_step: int) -> None:
    """Time `trainer`'s loop with `clock`, its scalars into Trainer's TensorBoard writer and its
    progress lines in place of Trainer's printed dicts; for a resumed run, `purge_step` drops
    the events written after its last checkpoint."""
    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(ProgressBar)
    callbacks = trainer.callback_handler.callbacks
    tensorboard = next((c for c in callbacks if isinstance(c, TensorBoardCallback)), None)
    trainer.add_callback(ThroughputCallback(tensorboard, clock))
    event_files = list(log_dir.glob("events.out.tfevents.*"))
    if tensorboard is None or not trainer.is_world_process_zero() or not event_files:
        return
    # TensorBoard reads a folder's event files in name order, and a name starts with the
    # second its writer was created: the new file must not share the last file's second, or
    # it may sort first and the purge would hit nothing.
    newest_second = max(int(path.name.split(".")[3]) for path in event_files)
    while time.time() < newest_second + 1:
        time.sleep(0.05)
    tensorboard.tb_writer = SummaryWriter(log_dir=str(log_dir), purge_step=start_step + 1)
