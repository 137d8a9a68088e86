"""The options of the pretraining stage, all in one place.

`pretrain/run.py` takes `ModelArguments`, `common.corpus.CorpusArguments` (which text),
`DataArguments`, `ReportArguments` and transformers' `TrainingArguments` (optimisation,
precision flags, checkpoints, output folder); `prepare-blocks` takes
`CorpusArguments` and `DataArguments`; `generate-text` takes
`GenerateArguments`. Each dataclass checks its own values when it is created and raises
`InputError` (one line: what, and how to fix it), so a bad value stops the program before
anything is read or written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from transformers import GPT2Config, PreTrainedTokenizerBase, TrainingArguments

from common.cli import InputError
from common.corpus import CorpusArguments
from pretrain.blocks.args import DataArguments
from pretrain.loss import LOSS_IMPLEMENTATIONS
from pretrain.model import PRESETS, build_model_config


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

    def model_config(self, tokenizer: PreTrainedTokenizerBase, block_size: int) -> GPT2Config:
        """The GPT-2 these options ask for, around `tokenizer`, for `block_size` blocks."""
        return build_model_config(
            self.model_preset,
            tokenizer,
            block_size,
            vocab_size=self.vocab_size,
            dropout=self.dropout,
            attn_implementation=self.attn_implementation,
        )

    def __post_init__(self) -> None:
        if self.loss_implementation not in LOSS_IMPLEMENTATIONS:
            raise InputError(
                f"--loss_implementation {self.loss_implementation} is not one of "
                f"{', '.join(LOSS_IMPLEMENTATIONS)}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise InputError(f"--dropout {self.dropout} must be in [0, 1), e.g. 0.1")


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
            raise InputError(f"--final_loss_window {self.final_loss_window} must be at least 1")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise InputError(f"--peak_tflops {self.peak_tflops} must be positive")


@dataclass
class GenerateArguments:
    """Which model to sample from, and how."""

    run_dir: str = field(
        metadata={"help": "Run folder (uses its final/ model) or a model folder (checkpoint)."}
    )
    prompt: str = field(
        default="", metadata={"help": "Text to continue; empty starts from end-of-text."}
    )
    max_new_tokens: int = field(default=60, metadata={"help": "Tokens to sample per text."})
    num_samples: int = field(default=1, metadata={"help": "How many continuations to print."})
    temperature: float = field(
        default=0.8, metadata={"help": "Softmax temperature: lower is more conservative."}
    )
    top_k: int = field(default=50, metadata={"help": "Sample among the k most likely tokens."})
    seed: int = field(default=0, metadata={"help": "Random seed, for repeatable samples."})
    device: str = field(
        default="auto", metadata={"help": "'auto' (a GPU if there is one), 'cpu' or 'cuda'."}
    )

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.num_samples < 1 or self.top_k < 1:
            raise InputError("--max_new_tokens, --num_samples and --top_k must be at least 1")
        if self.temperature <= 0:
            raise InputError(f"--temperature {self.temperature} must be positive")


class PretrainArguments(NamedTuple):
    """Every option of pretrain/run.py, one dataclass per concern."""

    model: ModelArguments
    corpus: CorpusArguments
    data: DataArguments
    report: ReportArguments
    training: TrainingArguments

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return resolved_options(*self)


def resolved_options(*argument_objects: Any) -> dict[str, dict[str, Any]]:
    """The resolved values, keyed by dataclass name (TrainingArguments hides secrets)."""
    return {
        type(arguments).__name__: (
            arguments.to_dict()
            if isinstance(arguments, TrainingArguments)
            else dataclasses.asdict(arguments)
        )
        for arguments in argument_objects
    }
