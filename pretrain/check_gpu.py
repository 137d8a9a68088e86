"""Pre-flight check of this machine's GPUs for a run: `check-gpu [pretrain/run.py's flags]`
(default --config: the course run's). The GPUs, driver, CUDA, bf16, TF32, SDPA kernels, NCCL;
whether the run's batch fits a GPU (else the batch x accumulation that keeps its global batch);
the loop's seconds predicted from a bf16 matmul timed here."""

import contextlib
import sys
import warnings
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from common.cli import InputError, entry_point
from pretrain.args import PretrainArguments, budget_in_whole_batches
from pretrain.device import cuda_unusable_reason
from pretrain.library_fixes import quiet_cpu_notices
from pretrain.metrics import (
    UTILISATION,
    flops_per_token,
    measure_matmul_tflops,
    memory_estimate,
    peak_flops_per_second,
    predicted_loop_seconds,
)
from pretrain.model import resolve_preset, round_vocab_size

COURSE_CONFIG = Path(__file__).parent / "configs" / "gpt2_117m.yaml"
COURSE_VOCAB_SIZE = 32768  # train-tokenizer's default, while the run's tokenizer is not there
USABLE_MEMORY = 0.85  # the rest: CUDA context, workspaces, gradients in flight, fragmentation
MATMUL_SIZE = 8192


def meta_model(args: PretrainArguments) -> GPT2LMHeadModel:
    """The run's GPT-2 on the meta device (shapes, no weights)."""
    vocab_size = args.model.vocab_size or COURSE_VOCAB_SIZE
    if args.model.vocab_size is None and Path(args.data.tokenizer_dir).is_dir():
        vocab_size = round_vocab_size(len(AutoTokenizer.from_pretrained(args.data.tokenizer_dir)))
    preset = resolve_preset(args.model.model_preset)._asdict()
    config = GPT2Config(vocab_size=vocab_size, bos_token_id=None, eos_token_id=None, **preset)
    with torch.device("meta"):  # special token ids: None, GPT2Config's exceed the vocabulary
        return GPT2LMHeadModel(config)


def memory_line(args: PretrainArguments, model: GPT2LMHeadModel, memory: int) -> str:
    """Whether the run's batch fits `memory` bytes, else the batch x accumulation that does."""

    def estimate(batch: int) -> str:
        parts = [part / 2**30 for part in memory_estimate(args, model, batch)]
        return f"about {sum(parts):.1f} GiB (weights, gradients, AdamW {parts[0]:.1f}; " + (
            f"activations {parts[1]:.1f}; loss {parts[2]:.1f})"
        )

    batch, gib = args.training.per_device_train_batch_size, memory / 2**30
    blocks = batch * args.training.gradient_accumulation_steps  # per optimizer step on one GPU
    line = f"memory at {batch} x {args.data.block_size} tokens: {estimate(batch)}"
    fitting = [b for b in range(blocks, 0, -1) if blocks % b == 0 and b <= batch]
    fitting = [b for b in fitting if sum(memory_estimate(args, model, b)) <= USABLE_MEMORY * memory]
    if fitting and fitting[0] == batch:
        return f"{line}: fits in {gib:.1f} GiB"
    line += f": more than {USABLE_MEMORY:.0%} of {gib:.1f} GiB"
    if not fitting:
        return f"{line}, even at one block: a smaller model or a larger GPU"
    return (
        f"{line}; keep the global batch with --per_device_train_batch_size {fitting[0]} "
        f"--gradient_accumulation_steps {blocks // fitting[0]}: {estimate(fitting[0])}"
    )


def gpu_lines() -> list[str]:
    """One line per GPU, then the driver's version (NVML, as torch.cuda reads it) and torch's."""
    lines = []
    for index in range(torch.cuda.device_count()):
        gpu = torch.cuda.get_device_properties(index)
        ampere = "yes" if gpu.major >= 8 else "no"  # bf16 and TF32 tensor cores, as torch decides
        lines.append(
            f"GPU {index}: {gpu.name}, {gpu.total_memory / 2**30:.1f} GiB, compute capability "
            f"{gpu.major}.{gpu.minor}, bf16 {ampere}, TF32 {ampere}"
        )
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = f"driver {pynvml.nvmlSystemGetDriverVersion()}"
    except Exception as err:  # no NVML library, or NVML's own error
        driver = f"driver unknown (NVML: {err})"
    return [*lines, f"{driver}; torch {torch.__version__} built for CUDA {torch.version.cuda}"]


def sdpa_line(device: torch.device) -> str:
    """The SDPA kernels that run a causal bf16 forward and backward of GPT-2's head size."""
    query = torch.randn(1, 12, 256, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    runs = []
    for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        with contextlib.suppress(RuntimeError):  # "No available kernel"
            with sdpa_kernel(getattr(SDPBackend, backend)), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's reasons for each kernel it cannot use
                F.scaled_dot_product_attention(query, query, query, is_causal=True).sum().backward()
            runs.append(backend.lower())
    return f"SDPA kernels that run (bf16, causal, head size 64): {', '.join(runs) or 'none'}"


@entry_point
def main(argv: list[str] | None = None) -> int:
    quiet_cpu_notices()  # TrainingArguments' torch_compile notice on a machine without a GPU
    argv = sys.argv[1:] if argv is None else argv
    (args,) = PretrainArguments.parse(
        argv if "--config" in argv else ["--config", str(COURSE_CONFIG), *argv],
        description=__doc__,
        prog="check-gpu",
    )
    if (reason := cuda_unusable_reason()) is not None:
        raise InputError(f"no usable GPU: {reason}")
    device, model = torch.device("cuda", 0), meta_model(args)
    lines = [*gpu_lines(), sdpa_line(device)]
    if torch.cuda.device_count() > 1:
        nccl = torch.distributed.is_nccl_available() and torch.cuda.nccl.version()
        lines.append(f"NCCL {'.'.join(map(str, nccl)) if nccl else 'missing: gloo only'}")
    lines.append(memory_line(args, model, torch.cuda.get_device_properties(device).total_memory))
    tflops = measure_matmul_tflops(device, torch.bfloat16, MATMUL_SIZE)
    peak = peak_flops_per_second(torch.cuda.get_device_name(device))
    datasheet = f" (datasheet peak {peak / 1e12:g})" if peak else ""
    lines.append(f"bf16 matmul {MATMUL_SIZE} x {MATMUL_SIZE}: {tflops:.0f} TFLOP/s{datasheet}")
    blocks = args.training.per_device_train_batch_size * args.training.gradient_accumulation_steps
    if (tokens := budget_in_whole_batches(args, blocks).max_train_tokens) is not None:
        seconds = predicted_loop_seconds(tokens, model, args.data.block_size, tflops)
        lines.append(
            f"training loop predicted: {seconds:.0f} s = {tokens:,} tokens x "
            f"{flops_per_token(model, args.data.block_size) / 1e9:.3f} GFLOP / ({tflops:.0f} "
            f"TFLOP/s x {UTILISATION:g}, the share of the matmul rate a step is assumed to reach)"
        )
    if prediction := args.report.prediction:
        lines.append(
            f"expected final loss {prediction[0]:.2f} +- {prediction[1]:.2f} nats per token "
            "(the ladder's fit on technical English, docs/BENCHMARKS_ARCHIVE.md; Web of Science "
            "may differ)"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
