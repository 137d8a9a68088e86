"""The chunked linear cross-entropy equals Hugging Face's GPT-2 loss, in value and gradient."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pretrain.loss import chunked_causal_lm_loss, use_chunked_loss

VOCAB_SIZE = 96
BATCH, SEQ = 3, 16


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=SEQ,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config).float()


def random_batch(seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB_SIZE, (BATCH, SEQ), generator=generator)


def loss_and_grads(model, input_ids, labels, **kwargs):
    model.zero_grad()
    loss = model(input_ids=input_ids, labels=labels, **kwargs).loss
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return loss.detach(), grads


@pytest.mark.parametrize("chunk_size", [1, 7, BATCH * SEQ, 1000])
@pytest.mark.parametrize("num_items_in_batch", [None, 100])
def test_matches_hf_loss_and_gradients_in_fp32(chunk_size, num_items_in_batch):
    input_ids = random_batch()
    labels = input_ids.clone()
    labels[0, :5] = -100  # ignored targets must be skipped, as HF does
    kwargs = {} if num_items_in_batch is None else {"num_items_in_batch": num_items_in_batch}

    reference = tiny_gpt2()
    ref_loss, ref_grads = loss_and_grads(reference, input_ids, labels, **kwargs)
    chunked = use_chunked_loss(tiny_gpt2(), chunk_size=chunk_size)
    loss, grads = loss_and_grads(chunked, input_ids, labels, **kwargs)

    assert ref_loss.item() > 1.0  # a real loss, not a degenerate one
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad, rtol=1e-4, atol=1e-6, msg=name)


def test_function_matches_logits_loss_under_bf16_autocast():
    torch.manual_seed(0)
    hidden = torch.randn(BATCH, SEQ, 32, requires_grad=True)
    weight = torch.randn(VOCAB_SIZE, 32, requires_grad=True)
    labels = random_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = hidden @ weight.T  # bf16, as lm_head under autocast
        ref = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, VOCAB_SIZE), labels[:, 1:].reshape(-1)
        )
        loss = chunked_causal_lm_loss(hidden, weight, labels, chunk_size=5)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    grads = torch.autograd.grad(loss, (hidden, weight))
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-3, atol=1e-3)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert grad.dtype == ref_grad.dtype
        torch.testing.assert_close(grad, ref_grad, rtol=2e-2, atol=2e-3)


def test_without_labels_the_model_returns_logits_as_before():
    input_ids = random_batch()
    reference = tiny_gpt2().eval()
    chunked = use_chunked_loss(tiny_gpt2()).eval()
    with torch.no_grad():
        ref_logits = reference(input_ids).logits
        logits = chunked(input_ids).logits
        eval_loss = chunked(input_ids, labels=input_ids).loss
        ref_eval_loss = reference(input_ids, labels=input_ids).loss
    torch.testing.assert_close(logits, ref_logits)
    torch.testing.assert_close(eval_loss, ref_eval_loss, rtol=1e-5, atol=1e-5)


def test_rejects_a_head_with_bias():
    model = tiny_gpt2()
    model.lm_head = torch.nn.Linear(32, VOCAB_SIZE, bias=True)
    with pytest.raises(ValueError, match="bias-free output embedding"):
        use_chunked_loss(model)


def test_trainer_with_chunked_loss_takes_the_same_steps(tmp_path):
    """Through Trainer (accelerate's forward wrapper, token-weighted gradient accumulation),
    both losses give the same logged losses and the same trained weights."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    blocks = torch.randint(0, VOCAB_SIZE, (8, SEQ), generator=torch.Generator().manual_seed(2))
    dataset = Dataset.from_dict({"input_ids": blocks.tolist(), "labels": blocks.tolist()})
    dataset.set_format("torch")

    def train(model, name):
        args = TrainingArguments(
            output_dir=str(tmp_path / name),
            use_cpu=True,
            report_to=[],
            max_steps=2,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            # SGD: Adam's first steps are ~lr * sign(grad) and would blow up rounding noise.
            optim="sgd",
            learning_rate=0.5,
            logging_steps=1,
            save_strategy="no",
            seed=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=dataset)
        trainer.train()
        logged = [entry for entry in trainer.state.log_history if "loss" in entry]
        losses = [(entry["loss"], entry["grad_norm"]) for entry in logged]
        return losses, dict(model.named_parameters())

    ref_losses, ref_params = train(tiny_gpt2(), "hf")
    losses, params = train(use_chunked_loss(tiny_gpt2(), chunk_size=9), "chunked")
    assert len(losses) == 2
    for (loss, grad_norm), (ref_loss, ref_grad_norm) in zip(losses, ref_losses, strict=True):
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        assert grad_norm == pytest.approx(ref_grad_norm, rel=1e-4)
    initial = dict(tiny_gpt2().named_parameters())
    for name, ref_param in ref_params.items():
        assert not torch.equal(ref_param, initial[name]), f"{name} was not trained"
        torch.testing.assert_close(params[name], ref_param, rtol=1e-4, atol=1e-5, msg=name)
