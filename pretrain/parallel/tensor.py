"""Tensor parallelism (Megatron-LM style) for transformers' GPT-2, with torch DTensor.

Every process of a 1-D device mesh holds 1/P of each large matrix and all of the activations:
attention's `c_attn` (q, k, v) split by output columns so that each rank holds whole heads,
its `c_proj` by input rows (one all-reduce of the partial products per attention); the MLP's
`c_fc` by columns, `c_proj` by rows (one all-reduce); the tied token embedding and output
layer by vocabulary rows (the lookup sums each rank's rows, the logits are gathered whole for
the loss). Position embeddings, layer norms and the biases after an all-reduce stay whole.

transformers has no tensor-parallel plan for GPT-2 (`tp_plan` is empty) and torch's
`ColwiseParallel`/`RowwiseParallel` take `nn.Linear` and `nn.Embedding` only, so the model's
`Conv1D` layers (y = x W + b, W stored as in x out) first become equal `nn.Linear` layers. A
model prepared here trains like the original but is no longer laid out as a saved GPT-2.
"""

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)
from transformers import GPT2LMHeadModel
from transformers.pytorch_utils import Conv1D

from common.cli import InputError

GPT2_TP_PLAN: dict[str, ParallelStyle] = {
    # Token ids are whole on every rank; each rank looks up its vocabulary rows.
    "transformer.wte": RowwiseParallel(input_layouts=Replicate()),
    "transformer.h.*.attn.c_attn": ColwiseParallel(),
    "transformer.h.*.attn.c_proj": RowwiseParallel(),
    "transformer.h.*.mlp.c_fc": ColwiseParallel(),
    "transformer.h.*.mlp.c_proj": RowwiseParallel(),
    # Whole logits for transformers' loss; the weight is split like the embedding it is tied to.
    "lm_head": ColwiseParallel(output_layouts=Replicate()),
}


def check_tensor_parallel_size(num_heads: int, num_ranks: int) -> None:
    """Refuse a split that would cut an attention head in two."""
    if num_heads % num_ranks:
        raise InputError(
            f"tensor parallelism over {num_ranks} processes needs a head count divisible by "
            f"{num_ranks}, but the model has {num_heads} heads; start a divisor of {num_heads} "
            "processes (torchrun --nproc_per_node)"
        )


def parallelize_gpt2(model: GPT2LMHeadModel, mesh: DeviceMesh) -> GPT2LMHeadModel:
    """Shard `model` in place over the 1-D `mesh` (GPT2_TP_PLAN) and return it; every rank
    starts from the same weights (same seed), and DTensor takes rank 0's."""
    num_ranks = mesh.size()
    check_tensor_parallel_size(model.config.n_head, num_ranks)
    for block in model.transformer.h:
        attention = block.attn
        attention.c_attn = group_qkv_by_rank(conv1d_to_linear(attention.c_attn), num_ranks)
        attention.c_proj = conv1d_to_linear(attention.c_proj)
        block.mlp.c_fc = conv1d_to_linear(block.mlp.c_fc)
        block.mlp.c_proj = conv1d_to_linear(block.mlp.c_proj)
        # The attention reads its q/k/v split size and head count from these attributes.
        attention.num_heads //= num_ranks
        attention.split_size //= num_ranks
        attention.embed_dim //= num_ranks
    parallelize_module(model, mesh, GPT2_TP_PLAN)
    # Each style distributed its own copy of the tied weight; keep one for both layers, so the
    # gradients of the lookup and of the logits add up in one place as in the original.
    model.lm_head.weight = model.transformer.wte.weight
    return model


def conv1d_to_linear(conv: Conv1D) -> nn.Linear:
    """An `nn.Linear` computing exactly what `conv` computes."""
    # Conv1D stores W as (in, out): nn.Linear's (in_features, out_features)
    linear = nn.Linear(*conv.weight.shape, device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.T)  # (out, in)
        linear.bias.copy_(conv.bias)
    return linear


def group_qkv_by_rank(c_attn: nn.Linear, num_ranks: int) -> nn.Linear:
    """Reorder the fused projection's output rows from [q | k | v] to [q_0 k_0 v_0 | q_1 ...]:
    the r-th contiguous 1/P of the rows (rank r's, `ColwiseParallel`) is then one set of heads."""
    hidden_size = c_attn.in_features
    shard_size = hidden_size // num_ranks
    with torch.no_grad():
        weight = c_attn.weight.view(3, num_ranks, shard_size, hidden_size)  # (qkv, rank, row, in)
        c_attn.weight.copy_(weight.transpose(0, 1).reshape(3 * hidden_size, hidden_size))
        bias = c_attn.bias.view(3, num_ranks, shard_size)
        c_attn.bias.copy_(bias.transpose(0, 1).reshape(3 * hidden_size))
    return c_attn


def clip_grad_norm_(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip sharded (DTensor) and whole parameters' gradients together by the full gradient's
    2-norm and return it (torch's `clip_grad_norm_` refuses the mix). A DTensor's norm covers
    all its shards; a whole parameter is the same on every rank and counts once."""
    with_grad = [p for p in parameters if p.grad is not None]
    sharded = [p for p in with_grad if isinstance(p.grad, DTensor)]
    whole = [p for p in with_grad if not isinstance(p.grad, DTensor)]
    squares = [torch.nn.utils.get_total_norm([p.grad for p in whole]) ** 2] if whole else []
    if sharded:
        squares.append(torch.nn.utils.get_total_norm([p.grad for p in sharded]).full_tensor() ** 2)
    total_norm = torch.stack(squares).sum().sqrt()
    for group in (whole, sharded):
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total_norm)
    return total_norm
