"""What the launcher asked for, checked against what the training processes actually got.

The accelerate config (passed on as environment variables) or Trainer's `--fsdp` /
`--deepspeed` ask for a strategy: DeepSpeed ZeRO, FSDP, data parallel or one process.
accelerate may set up another one without a word (1.15 drops FSDP and DeepSpeed on CPU
processes: pretrain/library_fixes.py mends it), and some strategies need hardware the processes
lack (FSDP1 needs GPUs). Such a run stops with one line: `check_request_fits_device` before
accelerate is set up, `check_strategy` right after.
"""

import os
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch.distributed.tensor import DTensor
from transformers import TrainingArguments

from common.cli import InputError

# What a run can ask for, in accelerate's words; data parallel is any of its MULTI_* types.
DATA_PARALLEL = "MULTI_* (data parallel)"
SINGLE_PROCESS = DistributedType.NO.name


def check_processes_joined(training_args: TrainingArguments) -> None:
    """Refuse a launch whose processes did not join one training (each would train alone)."""
    launched_processes = int(os.environ.get("WORLD_SIZE", "1"))
    if launched_processes != training_args.world_size:
        raise InputError(
            f"the launcher started {launched_processes} processes but they did not join one "
            f"training ({training_args.world_size} seen): on CPU pass --use_cpu true (or set "
            "ACCELERATE_USE_CPU=1), else check that every process sees its GPU"
        )


@dataclass(frozen=True)
class Request:
    """The strategy a run asks for, in accelerate's words, and the FSDP settings that need GPUs."""

    distributed_type: str  # DEEPSPEED, FSDP, DATA_PARALLEL or SINGLE_PROCESS
    fsdp_version: int | None = None
    fsdp_offload_params: bool = False


def requested_strategy(training_args: TrainingArguments) -> Request:
    """What the launch (its environment) and Trainer's own options ask for; read it before
    Trainer exists: its Accelerator rewrites the launcher's variables."""
    if _flag("ACCELERATE_USE_DEEPSPEED") or training_args.deepspeed:
        return Request(DistributedType.DEEPSPEED.name)
    fsdp_options = training_args.fsdp_plugin_args
    if fsdp_options is None and _flag("ACCELERATE_USE_FSDP"):
        # accelerate's own defaults when the config leaves them out
        fsdp_options = {
            "fsdp_version": os.environ.get("FSDP_VERSION", "1"),
            "cpu_offload": _flag("FSDP_OFFLOAD_PARAMS"),
        }
    if fsdp_options is not None:
        return Request(
            DistributedType.FSDP.name,
            fsdp_version=int(fsdp_options.get("fsdp_version", 1)),
            fsdp_offload_params=bool(fsdp_options.get("cpu_offload", False)),
        )
    return Request(DATA_PARALLEL if int(os.environ.get("WORLD_SIZE", "1")) > 1 else SINGLE_PROCESS)


def _flag(name: str) -> bool:
    """A launch variable as AcceleratorState reads it (not `parse_flag_from_env`): only "true"."""
    return os.environ.get(name, "false").lower() == "true"


def check_request_fits_device(request: Request, device: torch.device) -> None:
    """Refuse, before accelerate tries, a strategy these processes' device cannot run."""
    if device.type != "cpu":
        return
    if request.distributed_type == DistributedType.FSDP.name:
        if request.fsdp_version == 1:
            raise InputError(
                "FSDP1 (fsdp_version: 1, accelerate's default) needs GPUs and these processes "
                "run on the CPU; set fsdp_version: 2 (as accelerate_configs/cpu_fsdp.yaml does)"
            )
        if request.fsdp_offload_params:
            raise InputError(
                "fsdp_offload_params moves parameters from GPU to CPU memory and these processes "
                "have no GPU; set fsdp_offload_params: false in the accelerate config"
            )
    if request.distributed_type == DistributedType.DEEPSPEED.name:
        from deepspeed.accelerator import get_accelerator

        deepspeed_device = get_accelerator().device_name()
        if deepspeed_device != "cpu":
            raise InputError(
                f"these processes run on the CPU but DeepSpeed chose '{deepspeed_device}'; set "
                "DS_ACCELERATOR=cpu, or train on the GPUs without use_cpu"
            )


@dataclass(frozen=True)
class Strategy:
    """The parallelism in force: a short name, accelerate's distributed type, the processes."""

    name: str  # "single", "ddp", "fsdp1", "fsdp2", "zero1", "zero2" or "zero3"
    distributed_type: str
    num_processes: int


def check_strategy(request: Request, accelerator: Accelerator) -> Strategy:
    """The strategy accelerate set up; `InputError` unless it is the requested one."""
    state = accelerator.state
    distributed_type = state.distributed_type
    if distributed_type == DistributedType.DEEPSPEED:
        name = f"zero{state.deepspeed_plugin.zero_stage}"
    elif distributed_type == DistributedType.FSDP:
        name = f"fsdp{state.fsdp_plugin.fsdp_version}"
    elif distributed_type == DistributedType.NO or state.num_processes == 1:
        name = "single"
    else:
        name = "ddp"
    strategy = Strategy(name, distributed_type.name, state.num_processes)
    check_granted(request, strategy, accelerator.device.type)
    if distributed_type == DistributedType.DEEPSPEED:
        check_zero3_saves_a_model(state.deepspeed_plugin.deepspeed_config)
    return strategy


def check_granted(request: Request, strategy: Strategy, device_type: str) -> None:
    """Refuse a strategy in force that is not the requested one, naming both."""
    requested = request.distributed_type
    granted = {DATA_PARALLEL: strategy.name == "ddp", SINGLE_PROCESS: strategy.name == "single"}
    if granted.get(requested, strategy.distributed_type == requested):
        return
    if strategy.num_processes == 1:
        fix = "launch 2 or more processes with `launch-pretraining --num_processes N`"
    else:
        fix = (
            f"this accelerate does not set it up on {device_type} processes; install the "
            "versions in requirements.txt (pretrain/library_fixes.py adjusts them)"
        )
    raise InputError(
        f"the run asks for {requested} but accelerate set up {strategy.distributed_type} "
        f"on {strategy.num_processes} process(es): {fix}"
    )


def check_zero3_saves_a_model(deepspeed_config: dict) -> None:
    """Refuse ZeRO-3 that would save final/ as shards instead of a model file."""
    zero = deepspeed_config.get("zero_optimization", {})
    if zero.get("stage") == 3 and not zero.get("stage3_gather_16bit_weights_on_model_save"):
        raise InputError(
            "DeepSpeed ZeRO-3 would save final/ as DeepSpeed shards, which AutoModelForCausalLM "
            "cannot load; set zero3_save_16bit_model: true under deepspeed_config in the "
            "accelerate config (as accelerate_configs/cpu_deepspeed_zero3.yaml does)"
        )


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` stored by this process."""
    if isinstance(tensor, DTensor):
        return tensor.to_local()
    # A ZeRO-3 parameter is an empty placeholder outside forward; its shard is ds_tensor.
    return getattr(tensor, "ds_tensor", tensor)
