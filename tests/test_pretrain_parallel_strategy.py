"""What a launch asks for, read from the launcher's environment and Trainer's options, and the
one-line refusals when the device or accelerate cannot give it. The runs under `accelerate
launch` (test_pretrain_fsdp.py, test_pretrain_deepspeed.py) check the same on real processes."""

import pytest
import torch
from accelerate.utils import DeepSpeedPlugin
from transformers import TrainingArguments

from common.cli import InputError
from pretrain.parallel.strategy import (
    DATA_PARALLEL,
    SINGLE_PROCESS,
    Request,
    Strategy,
    check_granted,
    check_request_fits_device,
    check_zero3_saves_a_model,
    requested_strategy,
)

LAUNCHER_VARIABLES = (
    "WORLD_SIZE",
    "ACCELERATE_USE_FSDP",
    "ACCELERATE_USE_DEEPSPEED",
    "FSDP_VERSION",
    "FSDP_OFFLOAD_PARAMS",
)


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, Request(SINGLE_PROCESS)),
        ({"WORLD_SIZE": "2"}, Request(DATA_PARALLEL)),
        ({"WORLD_SIZE": "2", "ACCELERATE_USE_DEEPSPEED": "true"}, Request("DEEPSPEED")),
        (
            {"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"},
            Request("FSDP", fsdp_version=2),
        ),
        # accelerate's defaults when the config leaves the version out: FSDP1
        ({"ACCELERATE_USE_FSDP": "true"}, Request("FSDP", fsdp_version=1)),
        (
            {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "true"},
            Request("FSDP", fsdp_version=2, fsdp_offload_params=True),
        ),
    ],
)
def test_the_request_comes_from_the_launcher_environment(
    environment, expected, monkeypatch, tmp_path
):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # made first: with WORLD_SIZE set it would try to join the processes
    training_args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert requested_strategy(training_args) == expected


def test_trainer_fsdp_options_are_a_request_too(monkeypatch, tmp_path):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    training_args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        fsdp=True,
        fsdp_config={"fsdp_version": 2, "cpu_offload": True},
    )
    assert requested_strategy(training_args) == Request(
        "FSDP", fsdp_version=2, fsdp_offload_params=True
    )


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (Request("FSDP", fsdp_version=1), "FSDP1 .* needs GPUs.*fsdp_version: 2"),
        (Request("FSDP", fsdp_version=2, fsdp_offload_params=True), "fsdp_offload_params"),
    ],
)
def test_fsdp_that_needs_gpus_is_refused_on_cpu_processes(request_, message):
    with pytest.raises(InputError, match=message):
        check_request_fits_device(request_, torch.device("cpu"))
    check_request_fits_device(request_, torch.device("cuda"))  # fine where there are GPUs


@pytest.mark.parametrize(
    "request_",
    [Request("FSDP", fsdp_version=2), Request("DEEPSPEED"), Request(DATA_PARALLEL)],
)
def test_what_cpu_processes_can_run_passes(request_):
    check_request_fits_device(request_, torch.device("cpu"))


@pytest.mark.parametrize(
    ("request_", "strategy"),
    [
        (Request("FSDP", fsdp_version=2), Strategy("fsdp2", "FSDP", 2)),
        (Request("DEEPSPEED"), Strategy("zero3", "DEEPSPEED", 2)),
        (Request(DATA_PARALLEL), Strategy("ddp", "MULTI_CPU", 2)),
        (Request(SINGLE_PROCESS), Strategy("single", "NO", 1)),
        # one process started by torchrun is a process group of one: no data parallelism
        (Request(SINGLE_PROCESS), Strategy("single", "MULTI_CPU", 1)),
    ],
)
def test_the_requested_strategy_is_granted(request_, strategy):
    check_granted(request_, strategy, "cpu")


@pytest.mark.parametrize(
    ("request_", "strategy", "fix"),
    [
        # accelerate 1.15 without pretrain/library_fixes.py: FSDP silently became DDP
        (Request("FSDP", fsdp_version=2), Strategy("ddp", "MULTI_CPU", 2), "requirements.txt"),
        (Request("DEEPSPEED"), Strategy("single", "NO", 1), "--num_processes"),
        (Request(DATA_PARALLEL), Strategy("fsdp2", "FSDP", 2), "requirements.txt"),
    ],
)
def test_another_strategy_in_force_is_refused_naming_both(request_, strategy, fix):
    with pytest.raises(InputError) as refusal:
        check_granted(request_, strategy, "cpu")
    message = str(refusal.value)
    assert "\n" not in message
    assert f"asks for {request_.distributed_type}" in message
    assert f"set up {strategy.distributed_type}" in message
    assert fix in message


def test_zero3_that_would_save_only_shards_is_refused():
    with pytest.raises(InputError, match="zero3_save_16bit_model: true"):
        check_zero3_saves_a_model(DeepSpeedPlugin(zero_stage=3).deepspeed_config)
    check_zero3_saves_a_model(
        DeepSpeedPlugin(zero_stage=3, zero3_save_16bit_model=True).deepspeed_config
    )
    check_zero3_saves_a_model(DeepSpeedPlugin(zero_stage=2).deepspeed_config)
