"""GPT-2 model presets (transformers' `GPT2LMHeadModel`), random weights around a tokenizer.

The vocabulary is the tokenizer's rounded up to a multiple of 128, so that the embedding and the
output matmul tile evenly on tensor cores (nanoGPT pads 50257 to 50304 likewise).
"""

import logging
import math
import re
from typing import NamedTuple

from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerBase

from common.cli import InputError

logger = logging.getLogger(__name__)

VOCAB_MULTIPLE = 128
EMBEDDING_SHARE = 30  # GPT-2 117M's is 0.45, the tiny preset's with GPT-2's tokenizer 28


class ModelPreset(NamedTuple):
    """The shape of a GPT-2: depth, width, heads, and the longest sequence it can see."""

    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int


PRESETS: dict[str, ModelPreset] = {
    # GPT-2 "small" (Radford et al. 2019): 117M parameters as published, 124M as counted with
    # the 50257-token embedding; fewer here with a smaller custom vocabulary.
    "gpt2-117m": ModelPreset(n_layer=12, n_embd=768, n_head=12, n_positions=1024),
    # For tests and the CPU demo: a few seconds per hundred steps at block size 64.
    "tiny": ModelPreset(n_layer=2, n_embd=64, n_head=2, n_positions=256),
    # The recipe benchmarks' stand-in for gpt2-117m on a CPU (bench/compare_recipes.py):
    # GPT-2's head size (64), a sixth of its width, a third of its depth; minutes per run.
    "proxy": ModelPreset(n_layer=4, n_embd=128, n_head=2, n_positions=256),
    # Its second shape, twice as wide (a third of GPT-2's), for blocks of 256.
    "proxy_wide": ModelPreset(n_layer=4, n_embd=256, n_head=4, n_positions=256),
}


def resolve_preset(name: str) -> ModelPreset:
    """A preset by name, or a shape written "LxD" (e.g. "6x256"): L layers, D wide, heads of
    64 (GPT-2's head size), 1024 positions; the shapes of `bench.compare_recipes`."""
    if name in PRESETS:
        return PRESETS[name]
    if (shape := re.fullmatch(r"([0-9]+)x([0-9]+)", name)) is None:
        known = ", ".join(PRESETS)
        raise InputError(f"unknown model preset '{name}'; choose one of {known}, or LxD (6x256)")
    layers, width = map(int, shape.groups())
    if layers == 0 or width == 0 or width % 64:
        raise InputError(
            f"model shape '{name}' needs at least 1 layer and a width that is a positive "
            "multiple of 64 (the head size), e.g. 6x256"
        )
    return ModelPreset(layers, width, width // 64, n_positions=1024)


def round_vocab_size(num_tokens: int) -> int:
    return math.ceil(num_tokens / VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def build_model_config(
    preset_name: str,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    vocab_size: int | None = None,
    dropout: float = 0.0,
    attn_implementation: str = "sdpa",
    activation_function: str = "gelu_pytorch_tanh",
) -> GPT2Config:
    """Resolve a preset against a tokenizer; raise InputError for shapes that cannot work."""
    preset = resolve_preset(preset_name)
    if block_size > preset.n_positions:
        raise InputError(
            f"--block_size {block_size} is longer than the {preset.n_positions} positions of "
            f"preset '{preset_name}'; pass --block_size {preset.n_positions} or less"
        )
    num_tokens = len(tokenizer)
    if vocab_size is None:
        vocab_size = round_vocab_size(num_tokens)
    elif vocab_size < num_tokens:
        raise InputError(
            f"vocab_size {vocab_size} is smaller than the tokenizer's {num_tokens} tokens "
            f"(ids up to {num_tokens - 1} would index past the embedding); "
            f"drop --vocab_size or pass at least {round_vocab_size(num_tokens)}"
        )
    # The transformer's own parameters (about 12 d^2 a layer, and the positions) per
    # embedding row: past EMBEDDING_SHARE times them the embedding is the model.
    rest_per_row = 12 * preset.n_layer * preset.n_embd + preset.n_positions
    if vocab_size > EMBEDDING_SHARE * rest_per_row:
        logger.warning(
            "a vocabulary of %s entries makes the embedding %.0fx the rest of preset '%s' "
            "(%s parameters): memory and time go to it; preset '%s' suits up to about %s",
            f"{vocab_size:,}", vocab_size / rest_per_row, preset_name,
            f"{vocab_size * preset.n_embd:,}", preset_name, f"{EMBEDDING_SHARE * rest_per_row:,}",
        )  # fmt: skip
    return GPT2Config(
        vocab_size=vocab_size,
        **preset._asdict(),
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        # GPT2Config defaults these to GPT-2's own 50256; a custom tokenizer has its own ids.
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # Training never reuses past keys/values; generation turns the cache back on.
        use_cache=False,
        attn_implementation=attn_implementation,
        activation_function=activation_function,
    )


def build_model(config: GPT2Config) -> GPT2LMHeadModel:
    """A randomly initialised GPT-2 (never pretrained weights); logs its real size."""
    model = GPT2LMHeadModel(config)
    # transformers picks the loss by the class name, which names none for GPT2LMHeadModel: it
    # would warn on every run, and Trainer would divide the shifted loss by every label.
    model.loss_type = "ForCausalLM"
    logger.info(
        "GPT-2 %d layers x %d wide, %d heads, vocab %d: %s parameters (%s without position "
        "embeddings), attention %s",
        config.n_layer, config.n_embd, config.n_head, config.vocab_size,
        f"{model.num_parameters():,}", f"{num_matmul_parameters(model):,}",
        config._attn_implementation,
    )  # fmt: skip
    return model


def num_matmul_parameters(model: GPT2LMHeadModel) -> int:
    """transformers' `num_parameters()` (the tied token embedding counted once) less the
    position embeddings, a lookup that takes part in no matmul."""
    return model.num_parameters() - model.transformer.wpe.weight.numel()
