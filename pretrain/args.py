"""The options of the pretraining stage, all in one place.

`pretrain/run.py` takes `ModelArguments`, `common.corpus.CorpusArguments` (which text),
`DataArguments`, `ReportArguments` and transformers' `TrainingArguments` (optimisation,
precision flags, checkpoints, output folder); `python -m pretrain.prepare` takes
`CorpusArguments` and `DataArguments`; `python -m pretrain.generate` takes
`GenerateArguments`. Each dataclass checks its own values when it is created and raises
`InputError` (one line: what, and how to fix it), so a bad value stops the program before
anything is read or written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from transformers import TrainingArguments

from common.cli import InputError
from common.corpus import CorpusArguments
from pretrain.loss import LOSS_IMPLEMENTATIONS
from pretrain.model import PRESETS, check_block_size


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
            raise InputError(
                f"--loss_implementation {self.loss_implementation} is not one of "
                f"{', '.join(LOSS_IMPLEMENTATIONS)}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise InputError(f"--dropout {self.dropout} must be in [0, 1), e.g. 0.1")


@dataclass
class DataArguments:
    """Which tokenizer, how long the blocks are, how the corpus is split and budgeted."""

    tokenizer_dir: str = field(
        metadata={
            "help": "Tokenizer folder (from train-tokenizer, or any saved Hugging Face fast "
            "tokenizer with an eos token, e.g. GPT-2's)."
        }
    )
    cache_dir: str = field(
        default="data/cache",
        metadata={"help": "Folder that holds the packed-block caches, one subfolder per input."},
    )
    block_size: int = field(
        default=1024, metadata={"help": "Tokens per training example (the context length)."}
    )
    n_positions: int = field(
        default=1024,
        metadata={
            "help": "Position embeddings of the model the blocks are for (GPT-2: 1024); a "
            "--block_size above it is refused. pretrain/run.py checks against its model preset."
        },
    )
    validation_fraction: float = field(
        default=0.005,
        metadata={
            "help": "Share of documents held out for validation (at least enough for one block)."
        },
    )
    max_train_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Token budget: keep exactly ceil(max_train_tokens / block_size) training "
            "blocks, a seeded random sample of the corpus (default: all blocks)."
        },
    )
    repeat_corpus: bool = field(
        default=False,
        metadata={
            "help": "Allow a corpus smaller than --max_train_tokens: repeat it (reshuffled each "
            "pass) to fill the budget. Without it a too-small corpus is an error."
        },
    )
    num_proc: int | None = field(
        default=None,
        metadata={
            "help": "Processes for tokenization (default: one process; the tokenizer itself "
            "already uses every core). The blocks do not depend on it."
        },
    )
    map_batch_size: int = field(
        default=1000,
        metadata={"help": "Documents per tokenization batch. The blocks do not depend on it."},
    )
    split_seed: int = field(
        default=0,
        metadata={
            "help": "Seed of the document hash that picks the validation split and of the "
            "shuffle that picks the budget's training blocks."
        },
    )

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise InputError(f"--block_size {self.block_size} is too small; pass at least 2")
        check_block_size(self.block_size, self.n_positions, "the model (--n_positions)")
        if not 0.0 < self.validation_fraction < 1.0:
            raise InputError(
                f"--validation_fraction {self.validation_fraction} must be between 0 and 1 "
                "(exclusive), e.g. 0.005"
            )
        if self.max_train_tokens is not None and self.max_train_tokens < 1:
            raise InputError(f"--max_train_tokens {self.max_train_tokens} must be at least 1")
        if self.num_proc is not None and self.num_proc < 1:
            raise InputError(f"--num_proc {self.num_proc} must be at least 1")
        if self.map_batch_size < 1:
            raise InputError(f"--map_batch_size {self.map_batch_size} must be at least 1")


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
