"""What torch's Muon costs on a sharded matrix: the collectives DTensor runs for one step of
each GPT-2 117M hidden matrix as FSDP2 and tensor parallelism place it, and the step's seconds
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


def median_step_seconds(optimizer: torch.optim.Optimizer, repeats: int) -> float:
    optimizer.step()  # warm-up: the momentum buffer is made
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return sorted(seconds)[len(seconds) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="Timed steps per matrix.")
    repeats = parser.parse_args().repeats
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank = dist.get_rank()
    if rank == 0:
        print("| strategy | matrix | stored shape | placement | collectives per step "
              "| sharded step | whole step (one process) |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
    for strategy, name, shape, placement in PLACEMENTS:
        torch.manual_seed(0)
        weight, grad = torch.randn(shape), torch.randn(shape)
        sharded = torch.nn.Parameter(distribute_tensor(weight, mesh, [placement]))
        sharded.grad = distribute_tensor(grad, mesh, [placement])
        optimizer = torch.optim.Muon([sharded], lr=0.01)
        with CommDebugMode() as comm:
            optimizer.step()
        sharded_seconds = median_step_seconds(optimizer, repeats)
        whole_seconds = float("nan")
        if rank == 0:  # alone: the other process waits at the barrier below
            whole = torch.nn.Parameter(weight.clone())
            whole.grad = grad.clone()
            whole_optimizer = torch.optim.Muon([whole], lr=0.01)
            whole_optimizer.step()
            start = time.perf_counter()
            for _ in range(repeats):
                whole_optimizer.step()
            whole_seconds = (time.perf_counter() - start) / repeats
        dist.barrier()
        if rank == 0:
            counts = ", ".join(
                f"{count} {str(op).split('.')[-1]}" for op, count in comm.get_comm_counts().items()
            )
            print(f"| {strategy} | {name} | {shape[0]} x {shape[1]} | {placement} | {counts} "
                  f"| {sharded_seconds * 1e3:.0f} ms | {whole_seconds * 1e3:.0f} ms |")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
