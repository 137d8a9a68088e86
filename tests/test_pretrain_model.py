"""Model presets: shapes, vocabulary from the tokenizer, FLOPs per token, the loss Trainer reports,
the 117M preset on CPU."""

import logging

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, Trainer, TrainingArguments

from common.cli import InputError
from pretrain.batches import collate_blocks
from pretrain.metrics import flops_per_token
from pretrain.model import (
    PRESETS,
    build_model,
    build_model_config,
    num_matmul_parameters,
    round_vocab_size,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir):
    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))


@pytest.mark.parametrize(
    ("num_tokens", "expected"), [(1, 128), (128, 128), (129, 256), (50257, 50304)]
)
def test_vocab_rounds_up_to_a_multiple_of_128(num_tokens, expected):
    assert round_vocab_size(num_tokens) == expected


def test_config_takes_vocabulary_and_special_ids_from_the_tokenizer(tokenizer):
    config = build_model_config("tiny", tokenizer, block_size=64)
    assert config.vocab_size == round_vocab_size(len(tokenizer)) >= len(tokenizer)
    assert config.bos_token_id == config.eos_token_id == tokenizer.eos_token_id
    assert config.pad_token_id == tokenizer.pad_token_id != tokenizer.eos_token_id
    assert config.resid_pdrop == config.embd_pdrop == config.attn_pdrop == 0.0
    assert config._attn_implementation == "sdpa"


def test_gpt2_117m_preset_has_the_published_shape():
    preset, published = PRESETS["gpt2-117m"], GPT2Config()  # transformers' defaults: GPT-2 small
    assert (preset.n_layer, preset.n_embd, preset.n_head, preset.n_positions) == (
        published.n_layer,
        published.n_embd,
        published.n_head,
        published.n_positions,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"preset_name": "gpt3"}, "unknown model preset 'gpt3'; choose one of gpt2-117m, tiny"),
        ({"block_size": 257}, "block_size 257 is longer than the 256 positions"),
        ({"vocab_size": 100}, "smaller than the tokenizer's 512 tokens"),
    ],
)
def test_shapes_that_cannot_work_are_refused(tokenizer, kwargs, message):
    arguments = {"preset_name": "tiny", "block_size": 64, **kwargs}
    with pytest.raises(InputError, match=message):
        build_model_config(tokenizer=tokenizer, **arguments)


def test_a_shape_lxd_builds_that_gpt2_and_a_bad_shape_is_refused(tokenizer):
    config = build_model_config("3x192", tokenizer, block_size=1024)
    model = build_model(config)
    assert (config.n_layer, config.n_embd, config.n_head, config.n_positions) == (3, 192, 3, 1024)
    assert len(model.transformer.h) == 3 and model.transformer.wpe.weight.shape == (1024, 192)
    assert model.transformer.h[0].attn.head_dim == 64
    for bad in ("3x100", "0x256", "3x0"):
        with pytest.raises(InputError, match=f"model shape '{bad}' needs at least 1 layer"):
            build_model_config(bad, tokenizer, block_size=64)
    with pytest.raises(InputError, match="unknown model preset '3x'; .* or LxD"):
        build_model_config("3x", tokenizer, block_size=64)


def test_flops_per_token_follows_6n_plus_attention(tokenizer):
    model = build_model(build_model_config("tiny", tokenizer, block_size=64))
    n_layer, width, vocab, positions = 2, 64, 512, 256
    # Per layer: attention 4 d^2 + 4 d, MLP 8 d^2 + 5 d, two LayerNorms 4 d; final LayerNorm 2 d.
    matmul_params = vocab * width + n_layer * (12 * width**2 + 13 * width) + 2 * width
    assert num_matmul_parameters(model) == matmul_params
    assert model.num_parameters() == matmul_params + positions * width
    assert flops_per_token(model, 64) == 6 * matmul_params + 12 * n_layer * width * 64


@pytest.mark.slow
def test_gpt2_117m_builds_and_trains_one_step_on_cpu(tokenizer):
    # GPT-2's own padded vocabulary (50,257 -> 50,304) gives nanoGPT's count for GPT-2 small.
    config = build_model_config("gpt2-117m", tokenizer, block_size=128, vocab_size=50304)
    torch.manual_seed(0)
    model = build_model(config)
    assert model.num_parameters() == 124_475_904
    input_ids = torch.randint(0, len(tokenizer), (1, 128))
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    # A random model predicts uniformly: loss near ln(50304) = 10.83.
    assert 10.0 < loss.item() < 11.5
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_trainer_reports_the_models_own_mean_loss(tokenizer, tmp_path):
    """Trainer divides the summed loss by the tokens it counts, and counts the shifted targets
    (block_size - 1 per block) only for a model that names the causal-LM loss; GPT-2's class
    name names none, so `build_model` names it (otherwise the loss reads 15/16 of its value)."""
    model = build_model(build_model_config("tiny", tokenizer, block_size=16))
    blocks = torch.randint(0, len(tokenizer), (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=blocks, labels=blocks).loss.item()
    training_args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        max_steps=1,
        per_device_train_batch_size=4,
        learning_rate=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=[{"input_ids": block} for block in blocks],
        data_collator=collate_blocks,
    )
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert logged == [pytest.approx(expected, abs=1e-3)]


def test_a_vocabulary_far_past_what_the_preset_is_meant_for_is_warned_in_one_line(
    tokenizer, caplog
):
    """A tokenizer of 3,000,000 entries made a 'tiny' model of 192M parameters, silently."""
    with caplog.at_level(logging.WARNING, logger="pretrain.model"):
        build_model_config("gpt2-117m", tokenizer, 1024, vocab_size=50304)
        build_model_config("tiny", tokenizer, 64, vocab_size=2048)
        assert not caplog.records
        build_model_config("tiny", tokenizer, 64, vocab_size=3_000_000)
    (warning,) = caplog.messages
    assert warning.startswith("a vocabulary of 3,000,000 entries makes the embedding 1674x the")
    assert "preset 'tiny' suits up to about 53,760" in warning
