"""Causal-LM loss that never holds the full logits: chunked linear cross-entropy.

transformers' `ForCausalLMLoss` keeps every position's fp32 logits (6.6 GB at 32 x 1024 tokens
and a 50k vocabulary); here the head runs on a few thousand rows at a time, and each chunk's
gradients are kept from the forward pass instead of its logits. The value equals
`ForCausalLMLoss(lm_head(hidden), labels)` (same shift, ignore_index, `num_items_in_batch`).
transformers has none that runs on any device (its Liger integration needs a Triton kernel).
"""

import types

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutput

IGNORE_INDEX = -100
# Rows (token positions) per chunk: 4096 rows x 50k vocabulary = 0.8 GB of fp32 logits at a
# time, small next to the activations, yet a large enough matrix product to run at full speed.
DEFAULT_CHUNK_SIZE = 4096
LOSS_IMPLEMENTATIONS = ("hf", "chunked")


class _LinearCrossEntropySum(torch.autograd.Function):
    """sum_i CE(hidden_i @ weight^T, target_i) over rows not ignored; the gradients are
    computed chunk by chunk in forward, and only scaled by the incoming gradient in backward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, compute_dtype, compute_grads):
        # hidden: (N, H), weight: (V, H), targets: (N,)
        weight_c = weight.to(compute_dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if compute_grads else None
        # fp32 so that summing over chunks does not lose the low bits of a bf16 sum.
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if compute_grads else None
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            hidden_c = hidden[rows].to(compute_dtype)  # (C, H)
            target = targets[rows]  # (C,)
            valid = target != IGNORE_INDEX
            safe_target = target.masked_fill(~valid, 0)
            logits = (hidden_c @ weight_c.T).float()  # (C, V), this chunk only
            log_normalizer = torch.logsumexp(logits, dim=-1)  # (C,)
            target_logit = logits.gather(1, safe_target[:, None]).squeeze(1)
            total += ((log_normalizer - target_logit) * valid).sum()
            if compute_grads:
                # d CE / d logits = softmax(logits) - one_hot(target); zero on ignored rows.
                grad_logits = logits.sub_(log_normalizer[:, None]).exp_()  # in place: (C, V)
                grad_logits[torch.arange(len(target), device=target.device), safe_target] -= 1.0
                grad_logits.mul_(valid[:, None])
                grad_logits_c = grad_logits.to(compute_dtype)
                grad_hidden[rows] = grad_logits_c @ weight_c
                grad_weight += (grad_logits_c.T @ hidden_c).float()
        if compute_grads:
            ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_total, grad_weight * grad_total, None, None, None, None


def chunked_causal_lm_loss(
    hidden_states: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """`ForCausalLMLoss(hidden_states @ lm_head_weight.T, labels)` without the full logits; labels
    unshifted. The product runs in the autocast dtype (as `lm_head` would), the softmax in fp32."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    # Position t predicts label t + 1; the last position predicts nothing (as HF pads it).
    shift_labels = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])  # (B*T, H)
    targets = shift_labels.reshape(-1).to(hidden.device)
    device_type = hidden.device.type
    autocast = torch.is_autocast_enabled(device_type)
    compute_dtype = torch.get_autocast_dtype(device_type) if autocast else hidden.dtype
    compute_grads = torch.is_grad_enabled() and (
        hidden.requires_grad or lm_head_weight.requires_grad
    )
    total = _LinearCrossEntropySum.apply(
        hidden, lm_head_weight, targets, chunk_size, compute_dtype, compute_grads
    )
    if num_items_in_batch is None:
        return total / (targets != IGNORE_INDEX).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def use_chunked_loss(model: nn.Module, chunk_size: int = DEFAULT_CHUNK_SIZE) -> nn.Module:
    """Make `model` compute its loss with `chunked_causal_lm_loss` when called with `labels`
    (returning `logits=None`), by replacing this instance's forward, as transformers' Liger
    integration does: Trainer, DDP and `save_pretrained` see the usual model."""
    head = model.get_output_embeddings()
    if head is None or getattr(head, "bias", None) is not None:
        raise ValueError(
            f"{type(model).__name__} has no bias-free output embedding; "
            "use loss_implementation 'hf' for it"
        )
    model._loss_chunk_size = chunk_size
    model.forward = types.MethodType(_forward_with_chunked_loss, model)
    return model


def _forward_with_chunked_loss(
    self,
    input_ids: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
    **kwargs,
):
    if labels is None:
        return type(self).forward(self, input_ids=input_ids, **kwargs)
    kwargs["use_cache"] = False
    body_outputs = self.base_model(input_ids, **kwargs)
    loss = chunked_causal_lm_loss(
        body_outputs.last_hidden_state,
        self.get_output_embeddings().weight,
        labels,
        num_items_in_batch=num_items_in_batch,
        chunk_size=self._loss_chunk_size,
    )
    return CausalLMOutput(loss=loss, logits=None)
