"""What Muon costs on a sharded matrix: the collectives of one step of each GPT-2 117M hidden
matrix as FSDP2 and tensor parallelism place it, and the step's seconds, for torch's Muon on
the shards (DTensor splits every Newton-Schulz product across the processes) and for
pretrain.optim's step (gradient and momentum gathered once, orthogonalised on each process),
against the same step on the whole matrix in one process.

    torchrun --standalone --nproc_per_node 2 -m bench.muon_collectives [--repeats 5]

FSDP2 shards a stored parameter by rows: Conv1D's (in, out), so Shard(0) of (768, 3072) for
the MLP's c_fc; tensor parallelism holds nn.Linear's (out, in) split by rows (Colwise: Shard(0))
or by columns (Rowwise: Shard(1)).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from pretrain.optim import MuonWithAdamW

# (strategy, matrix, stored shape, placement): GPT-2 117M's four hidden matrices under each.
PLACEMENTS = [
    ("fsdp2", "attn.c_attn", (768, 2304), Shard(0)),
    ("fsdp2", "attn.c_proj", (768, 768), Shard(0)),
    ("fsdp2", "mlp.c_fc", (768, 3072), Shard(0)),
    ("fsdp2", "mlp.c_proj", (3072, 768), Shard(0)),
    ("tp", "attn.c_attn", (2304, 768), Shard(0)),
    ("tp", "attn.c_proj", (768, 768), Shard(1)),
    ("tp", "mlp.c_fc", (3072, 768), Shard(0)),
    ("tp", "mlp.c_proj", (768, 3072), Shard(1)),
]


def muon_step(matrix: torch.nn.Parameter) -> MuonWithAdamW:
    """pretrain.optim's optimizer over `matrix` alone (its AdamW half holds an unused scalar)."""
    scalar = torch.nn.Parameter(torch.zeros(()))
    return MuonWithAdamW([{"params": [matrix]}], [{"params": [scalar]}], torch.optim.AdamW, {})


def timed_steps(optimizer, matrix: torch.nn.Parameter, grad: torch.Tensor, repeats: int):
    """The collectives of one step after the first (which makes the momentum) and the median
    seconds of `repeats` more, each from `grad` (the gathered step replaces a shard's)."""
    matrix.grad = grad
    optimizer.step()
    matrix.grad = grad
    with CommDebugMode() as comm:
        optimizer.step()
    seconds = []
    for _ in range(repeats):
        matrix.grad = grad
        start = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return sum(comm.get_comm_counts().values()), sorted(seconds)[len(seconds) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="Timed steps per matrix.")
    repeats = parser.parse_args().repeats
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank = dist.get_rank()
    if rank == 0:
        print(
            "| strategy | matrix | stored shape | placement | torch's Muon on shards: "
            "collectives, seconds | gathered: collectives, seconds | whole, one process |"
        )
        print("|---|---|---|---|---|---|---|")  # fmt: skip
    for strategy, name, shape, placement in PLACEMENTS:
        torch.manual_seed(0)
        weight, grad = torch.randn(shape), torch.randn(shape)
        cells = []
        for gathered in (False, True):
            sharded = torch.nn.Parameter(distribute_tensor(weight, mesh, [placement]))
            optimizer = muon_step(sharded) if gathered else torch.optim.Muon([sharded])
            sharded_grad = distribute_tensor(grad, mesh, [placement])
            counts, seconds = timed_steps(optimizer, sharded, sharded_grad, repeats)
            cells.append(f"{counts}, {seconds * 1e3:.0f} ms")
        whole_seconds = float("nan")
        if rank == 0:  # alone: the other process waits at the barrier below
            whole = torch.nn.Parameter(weight.clone())
            _, whole_seconds = timed_steps(torch.optim.Muon([whole]), whole, grad, repeats)
        dist.barrier()
        if rank == 0:
            print(f"| {strategy} | {name} | {shape[0]} x {shape[1]} | {placement} | {cells[0]} "
                  f"| {cells[1]} | {whole_seconds * 1e3:.0f} ms |")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
