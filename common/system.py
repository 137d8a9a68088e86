"""What a run ran on: hardware and library versions, recorded in every run summary."""

import importlib.metadata
import logging
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

logger = logging.getLogger(__name__)


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


def threads_for_load(cores: int, load: float, local_processes: int) -> int:
    """Threads for one of `local_processes` processes on `cores` cores kept busy by `load` (the
    1-minute average, whole cores counted): those it leaves free, shared, at least one."""
    return max(1, (cores - int(load)) // local_processes)


def use_allotted_cores() -> None:
    """Torch's threads for the node a run finds: the cores Slurm gave its task
    (SLURM_CPUS_PER_TASK), else the affinity mask where it is narrower than the machine
    (taskset, Slurm's binding, a container's cpuset: the load average counts the whole
    machine), else the cores the load leaves free (a thread per core of a busy node waits on
    the others: docs/SLURM.md); shared by the node's processes (LOCAL_WORLD_SIZE), within the
    mask always. OMP_NUM_THREADS, when set, wins, within the mask."""
    affinity = len(os.sched_getaffinity(0))
    asked, allotted, local = (
        int(value) if (value := os.environ.get(name, "")).isdigit() and int(value) > 0 else None
        for name in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK", "LOCAL_WORLD_SIZE")
    )
    local = local or 1
    if asked is not None:
        threads, reason = min(asked, affinity), ""
    elif allotted is not None or affinity < (os.cpu_count() or affinity):
        threads = threads_for_load(min(allotted or affinity, affinity), 0, local)
        reason = f"SLURM_CPUS_PER_TASK={allotted}" if allotted else "the affinity mask"
    else:
        load = os.getloadavg()[0]
        threads = threads_for_load(affinity, load, local)
        reason = f"load {load:.1f} leaves {max(affinity - int(load), 0)} free"
    if asked is None and threads < affinity:
        shared = f", {local} processes on this node" if local > 1 else ""
        logger.info(
            "using %d of %d cores (%s%s); set OMP_NUM_THREADS to choose",
            threads, affinity, reason, shared,
        )  # fmt: skip
    if asked is None and allotted is None and threads == affinity:
        return  # torch's default already follows the mask
    # This process's own: once torch is imported (it read the variable then) not exported, so
    # that a launcher's processes each take their share rather than inherit it as asked.
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)


def build_extensions_in_this_environment() -> None:
    """Torch's JIT-built extensions (DeepSpeed's CPU communication op, `deepspeed_shm_comm`) in
    this Python environment's folder, built once: in the home's shared ~/.cache/torch_extensions
    each checkout's venv rebuilds the op over the other's, minutes before the first step, under
    a file lock. TORCH_EXTENSIONS_DIR, when set, wins; a read-only environment keeps torch's."""
    if "TORCH_EXTENSIONS_DIR" not in os.environ and os.access(sys.prefix, os.W_OK):
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(sys.prefix, "torch_extensions")
