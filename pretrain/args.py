"""Options of `pretrain/run.py` that transformers' `TrainingArguments` does not cover.

The full command line is these dataclasses plus `common.corpus.CorpusArguments` (which text),
`pretrain.data.DataArguments` (tokenizer, block size, token budget) and transformers'
`TrainingArguments` (optimisation, precision flags, checkpoints, output folder).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pretrain.loss import LOSS_IMPLEMENTATIONS
from pretrain.model import PRESETS


@dataclass
class ModelArguments:
    """Which GPT-2 to build; weights are always random (training from scratch)."""

    model_preset: str = field(
        default="gpt2-117m",
        metadata={"help": f"Model shape, one of: {', '.join(PRESETS)}."},
    )
    vocab_size: int | None = field(
        default=None,
        metadata={
            "help": "Embedding rows. Default: the tokenizer's size rounded up to a multiple of "
            "128. An explicit value must be at least the tokenizer's size."
        },
    )
    dropout: float = field(
        default=0.0,
        metadata={
            "help": "Dropout on embeddings, attention and residuals. 0 for a single pass over "
            "12M tokens: there is nothing to overfit yet and dropout slows learning."
        },
    )
    attn_implementation: str = field(
        default="sdpa",
        metadata={
            "help": "Attention kernel: 'sdpa' (PyTorch scaled_dot_product_attention, flash "
            "kernels on recent GPUs), 'eager', or 'flash_attention_2' if installed."
        },
    )
    loss_implementation: str = field(
        default="hf",
        metadata={
            "help": "Training loss: 'hf' (transformers' cross-entropy over the full fp32 logits) "
            "or 'chunked' (the same value computed a few thousand positions at a time, "
            "pretrain/loss.py: far less memory at large batch x vocabulary)."
        },
    )

    compile_regions: bool = field(
        default=True,
        metadata={
            "help": "With --torch_compile: compile each transformer block on its own "
            "(accelerate's regional compilation): the 12 identical blocks are compiled once and "
            "reused, which starts much sooner than compiling the whole model as one graph."
        },
    )

    def __post_init__(self) -> None:
        if self.loss_implementation not in LOSS_IMPLEMENTATIONS:
            raise ValueError(
                f"loss_implementation must be one of {', '.join(LOSS_IMPLEMENTATIONS)}, "
                f"got '{self.loss_implementation}'"
            )


@dataclass
class ReportArguments:
    """How the run is measured and judged in TensorBoard and run_summary.json."""

    final_loss_window: int = field(
        default=5,
        metadata={
            "help": "The final loss is the mean of this many last logged training losses "
            "(each already a mean over --logging_steps steps)."
        },
    )
    loss_threshold: float = field(
        default=7.0,
        metadata={"help": "The run passes when its final loss is below this value."},
    )
    peak_tflops: float | None = field(
        default=None,
        metadata={
            "help": "Peak TFLOP/s of one device, for MFU. Default: looked up from the GPU name "
            "(dense 16-bit tensor-core peak); no MFU on CPU unless given."
        },
    )

    def __post_init__(self) -> None:
        if self.final_loss_window < 1:
            raise ValueError(f"final_loss_window must be at least 1, got {self.final_loss_window}")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise ValueError(f"peak_tflops must be positive, got {self.peak_tflops}")
