"""Whether this process has a CUDA GPU to train on and, if not, why, in torch's own words: a run
that means a GPU stops in one line before it reads anything; the CPU trains only when asked."""

import argparse
import os
import re
import shutil

import torch
from accelerate.commands.config import default_config_file
from accelerate.utils import parse_flag_from_env

from common.cli import InputError, load_config_file

# Set by launch-pretraining for its processes: the accelerate config file that means a GPU.
GPU_REQUIRED_VARIABLE = "PRETRAIN_GPU_REQUIRED_BY"
ASK_FOR_A_GPU = "ask the job for a GPU (sbatch --gres=gpu:1)"


def cuda_unusable_reason() -> str | None:
    """Why this process cannot use a CUDA GPU, and what to do; None when it can."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not torch.backends.cuda.is_built():
        return f"this torch ({torch.__version__}) is built without CUDA; install a CUDA build"
    if visible is not None and not visible.strip():
        return f"CUDA_VISIBLE_DEVICES is empty, so no GPU is visible: {ASK_FOR_A_GPU}"
    try:
        torch.cuda.init()  # raises what is_available() only warns about: no driver, too old...
    except RuntimeError as err:
        # The driver's CUDA version as torch reports it (cudaDriverGetVersion: 12080 is 12.8).
        too_old = re.search(r"driver on your system is too old \(found version (\d+)\)", str(err))
        if too_old is None:
            said = f'torch says "{str(err).split(". ")[0].rstrip(".")}"'
            if (given := gpu_given()) is None:
                where = "" if visible is None else f" (CUDA_VISIBLE_DEVICES={visible})"
                return f"{said}{where}: {ASK_FOR_A_GPU}"
            look = "nvidia-smi on this node shows what the driver sees (the GPU, its CUDA, users)"
            if shutil.which("nvidia-smi") is None:
                look = "this node has no NVIDIA driver (no nvidia-smi); run on one that has it"
            return f"{said}, though {given} gives this job a GPU: {look}"
        found = int(too_old[1])
        return (
            f"the NVIDIA driver supports CUDA {found // 1000}.{found % 1000 // 10}, too old for "
            f"this torch's CUDA {torch.version.cuda} (torch {torch.__version__}): update the "
            "driver or install a torch built for its CUDA (docs/INSTALL.md)"
        )
    return None


def gpu_given() -> str | None:
    """`NAME=value` of what gives this process a GPU (CUDA_VISIBLE_DEVICES naming one, Slurm's
    GPUs of the job), or None: no driver then means a node without one, not a job without."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS"):  # lists of GPUs
        value = os.environ.get(name, "").strip()
        if value and not value.startswith("-"):  # -1 hides every GPU
            return f"{name}={value}"
    count = os.environ.get("SLURM_GPUS_ON_NODE", "")
    return f"SLURM_GPUS_ON_NODE={count}" if count.isdigit() and int(count) > 0 else None


def check_gpu_when_required(use_cpu: bool, require_gpu: bool) -> None:
    """InputError when the run means a GPU, does not ask for the CPU, and has no usable GPU."""
    required_by = os.environ.get(GPU_REQUIRED_VARIABLE) or (require_gpu and "require_gpu: true")
    if not required_by or use_cpu or parse_flag_from_env("ACCELERATE_USE_CPU"):
        return
    if (reason := cuda_unusable_reason()) is not None:
        raise InputError(
            f"no usable GPU: {reason}; {required_by} asks for a GPU (to train on the CPU instead, "
            "pass --use_cpu true)"
        )


def mark_gpu_required(launch_args: argparse.Namespace) -> None:
    """Tell the training processes (GPU_REQUIRED_VARIABLE) when the launch's accelerate config
    (or accelerate's default one) means a GPU: no `use_cpu: true`, `--cpu`, ACCELERATE_USE_CPU."""
    path = launch_args.config_file
    if path is None and os.path.isfile(default_config_file):
        path = default_config_file
    cpu = launch_args.cpu or parse_flag_from_env("ACCELERATE_USE_CPU")
    if path is not None and not cpu and not load_config_file(path).get("use_cpu", False):
        os.environ[GPU_REQUIRED_VARIABLE] = str(path)
