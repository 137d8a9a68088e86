"""What one training process holds: its parameters, its optimizer state, its peak memory.

The numbers are what the process really keeps, whatever the parallelism: a tensor-parallel or
FSDP2 parameter (a DTensor) counts its local shard, a DeepSpeed ZeRO-3 parameter its local
partition (`ds_tensor`), a tied weight once. The optimizer state is every tensor the optimizer
keeps per parameter (AdamW: two moments and a step count) plus the parameters it updates that
are not the model's own: the fp32 master copies of mixed precision and DeepSpeed's flat
partitions. Call `rank_footprint` after at least one optimizer step (the state is created at
the first), on every process, then `gather_footprints` to have every process's record.

Peak memory: on CUDA the most bytes of tensors allocated at once (`max_memory_allocated`); on
CPU the peak resident set of the whole process (`getrusage`), which includes the interpreter,
the libraries and the data: compare it between processes and strategies, not with the
parameter bytes.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


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


def gather_footprints(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every process's record, in rank order, on every process (a collective: all call it)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [record]
    records: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    return records


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` stored by this process."""
    if isinstance(tensor, DTensor):
        return tensor.to_local()
    # A ZeRO-3 parameter is an empty placeholder outside forward; its shard is ds_tensor.
    return getattr(tensor, "ds_tensor", tensor)


def tensor_bytes(tensor: torch.Tensor) -> int:
    local = local_tensor(tensor)
    return local.numel() * local.element_size()


def parameter_bytes(parameters: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct parameters (a tied weight once), local parts only."""
    distinct = {id(parameter): parameter for parameter in parameters}
    return sum(tensor_bytes(parameter) for parameter in distinct.values())


def innermost_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside wrappers (accelerate's AcceleratedOptimizer, DeepSpeed's ZeRO
    optimizer), each of which keeps the one it wraps as `.optimizer`."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def optimizer_state_bytes(optimizer: Any, model: nn.Module) -> int:
    """Bytes of the optimizer's per-parameter state and of the parameters it updates that are
    not `model`'s (master copies, flat partitions), local parts only."""
    inner = innermost_optimizer(optimizer)
    state_tensors = [
        value
        for state in inner.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]
    model_parameters = {id(parameter) for parameter in model.parameters()}
    own_copies = [
        parameter
        for group in inner.param_groups
        for parameter in group["params"]
        if id(parameter) not in model_parameters
    ]
    return sum(tensor_bytes(tensor) for tensor in state_tensors) + parameter_bytes(own_copies)


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Peak bytes of this process on `device`, and how they were measured."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kibibytes, macOS bytes.
    return (peak if sys.platform == "darwin" else peak * 1024), "process_max_rss"
