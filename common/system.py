"""What a run ran on: hardware and library versions, recorded in every run summary."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

TRACKED_LIBRARIES = (
    "torch",
    "torchvision",
    "transformers",
    "accelerate",
    "datasets",
    "tokenizers",
    "lightning",
    "torchmetrics",
    "tensorboard",
)


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that decide results and speed."""
    versions = {"python": platform.python_version()}
    for name in TRACKED_LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def hardware_description() -> dict[str, object]:
    """CPU count and, when present, the CUDA devices with their memory."""
    # Imported here: the tokenizer stage records its hardware too and needs nothing else of torch.
    import torch

    info: dict[str, object] = {
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [
            {
                "name": torch.cuda.get_device_name(i),
                "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
            }
            for i in range(torch.cuda.device_count())
        ]
        info["cuda"] = torch.version.cuda
    return info


def use_allotted_cores() -> None:
    """Torch's threads: the cores Slurm gave this task (SLURM_CPUS_PER_TASK), not the whole
    node's. Torch already follows the CPU affinity (taskset, Slurm's core binding); where Slurm
    does not bind, a thread per core of a busy node waits on the others (docs/SLURM.md: 4-5x
    slower). OMP_NUM_THREADS, when set, wins."""
    allotted = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if "OMP_NUM_THREADS" in os.environ or not allotted.isdigit() or int(allotted) < 1:
        return
    os.environ["OMP_NUM_THREADS"] = allotted  # torch, and any worker process, reads it
    if "torch" in sys.modules:  # already imported: it has read the variable
        sys.modules["torch"].set_num_threads(int(allotted))


def build_extensions_in_this_environment() -> None:
    """Torch's JIT-built extensions (DeepSpeed's CPU communication op, `deepspeed_shm_comm`) in
    this Python environment's folder, built once: in the home's shared ~/.cache/torch_extensions
    each checkout's venv rebuilds the op over the other's, minutes before the first step, under
    a file lock. TORCH_EXTENSIONS_DIR, when set, wins; a read-only environment keeps torch's."""
    if "TORCH_EXTENSIONS_DIR" not in os.environ and os.access(sys.prefix, os.W_OK):
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(sys.prefix, "torch_extensions")
