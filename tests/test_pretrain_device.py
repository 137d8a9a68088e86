"""No GPU, no GPU run: the diagnosis in torch's words, and the run that means a GPU refusing in
one line before it reads anything. Where CUDA must fail whatever the machine, the tests hide the
GPUs (CUDA_VISIBLE_DEVICES=""); torch's own failures are raised by a stand-in for
`torch.cuda.init`, the one CUDA call the diagnosis makes."""

import os
import subprocess
import sys

import pytest
import torch
from accelerate.commands.launch import launch_command_parser
from pretrain_runs import REPO_ROOT, RUN_SCRIPT, TINY_CONFIG, subprocess_env

from common.cli import InputError
from pretrain.device import (
    ASK_FOR_A_GPU,
    GPU_REQUIRED_VARIABLE,
    check_gpu_when_required,
    cuda_unusable_reason,
    mark_gpu_required,
)
from pretrain.run import main

COURSE_CONFIG = TINY_CONFIG.with_name("gpt2_117m.yaml")
ACCELERATE_CONFIGS = REPO_ROOT / "accelerate_configs"
# What torch 2.11 (CUDA 13.0) raises on a driver of the CUDA 12.8 series.
DRIVER_TOO_OLD = (
    "The NVIDIA driver on your system is too old (found version 12080). Please update your GPU "
    "driver by downloading and installing a new version from the URL: "
    "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to "
    "install a PyTorch version that has been compiled with your version of the CUDA driver."
)


@pytest.fixture
def no_gpu_visible(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv(GPU_REQUIRED_VARIABLE, raising=False)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)


def cuda_init_raising(monkeypatch, message: str) -> None:
    def init():
        raise RuntimeError(message)

    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "init", init)


def test_a_driver_too_old_is_named_with_its_cuda_and_torch_s(monkeypatch):
    cuda_init_raising(monkeypatch, DRIVER_TOO_OLD)
    reason = cuda_unusable_reason()
    assert reason.startswith(
        f"the NVIDIA driver supports CUDA 12.8, too old for this torch's CUDA {torch.version.cuda}"
    )
    assert "install a torch built for its CUDA" in reason


def test_no_driver_and_no_device_are_torch_s_words_and_ask_for_a_gpu(monkeypatch):
    cuda_init_raising(monkeypatch, "Found no NVIDIA driver on your system. Please check that...")
    assert cuda_unusable_reason() == (
        'torch says "Found no NVIDIA driver on your system": ask the job for a GPU '
        "(sbatch --gres=gpu:1)"
    )
    cuda_init_raising(monkeypatch, "No CUDA GPUs are available")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert cuda_unusable_reason().startswith(
        'torch says "No CUDA GPUs are available" (CUDA_VISIBLE_DEVICES=-1): ask the job'
    )


def test_a_job_given_a_gpu_without_a_usable_driver_is_told_to_look_at_the_node(
    monkeypatch, tmp_path
):
    cuda_init_raising(monkeypatch, "Found no NVIDIA driver on your system. Please check that...")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    for name, value in [("CUDA_VISIBLE_DEVICES", "0"), ("SLURM_GPUS_ON_NODE", "1")]:
        with monkeypatch.context() as given:
            given.setenv(name, value)
            reason = cuda_unusable_reason()
        assert reason == (
            f'torch says "Found no NVIDIA driver on your system", though {name}={value} gives '
            "this job a GPU: this node has no NVIDIA driver (no nvidia-smi); run on one that has it"
        )
    nvidia_smi = tmp_path / "nvidia-smi"
    nvidia_smi.write_text("#!/bin/sh\n")
    nvidia_smi.chmod(0o755)  # a driver's tool is there: what the driver sees is the question
    monkeypatch.setenv("SLURM_JOB_GPUS", "2")
    assert "SLURM_JOB_GPUS=2 gives this job a GPU: nvidia-smi on this node shows" in (
        cuda_unusable_reason()
    )
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "0")  # a count: none given
    monkeypatch.delenv("SLURM_JOB_GPUS")
    assert cuda_unusable_reason().endswith(ASK_FOR_A_GPU)


def test_an_empty_cuda_visible_devices_and_a_torch_without_cuda(no_gpu_visible, monkeypatch):
    assert cuda_unusable_reason().startswith("CUDA_VISIBLE_DEVICES is empty, so no GPU is visible")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    assert "is built without CUDA" in cuda_unusable_reason()


def test_the_cpu_runs_only_when_asked_for(no_gpu_visible, monkeypatch):
    check_gpu_when_required(use_cpu=False, require_gpu=False)  # nothing asks for a GPU
    check_gpu_when_required(use_cpu=True, require_gpu=True)  # --use_cpu true wins
    with pytest.raises(InputError, match=r"^no usable GPU: CUDA_VISIBLE_DEVICES is empty.*; "
                       r"require_gpu: true asks for a GPU \(to train on the CPU instead, pass "
                       r"--use_cpu true\)$"):  # fmt: skip
        check_gpu_when_required(use_cpu=False, require_gpu=True)
    monkeypatch.setenv(GPU_REQUIRED_VARIABLE, "accelerate_configs/fsdp.yaml")
    with pytest.raises(InputError, match="accelerate_configs/fsdp.yaml asks for a GPU"):
        check_gpu_when_required(use_cpu=False, require_gpu=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")  # what the Slurm scripts set for the CPU
    check_gpu_when_required(use_cpu=False, require_gpu=False)


@pytest.mark.parametrize(
    "config_file", sorted(path.name for path in ACCELERATE_CONFIGS.glob("*.yaml"))
)
def test_every_accelerate_config_not_named_cpu_means_a_gpu(config_file, monkeypatch):
    monkeypatch.delenv(GPU_REQUIRED_VARIABLE, raising=False)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    path = str(ACCELERATE_CONFIGS / config_file)
    mark_gpu_required(launch_command_parser().parse_args(["--config_file", path, "run.py"]))
    assert (os.environ.get(GPU_REQUIRED_VARIABLE) == path) != config_file.startswith("cpu")
    monkeypatch.delenv(GPU_REQUIRED_VARIABLE, raising=False)
    mark_gpu_required(launch_command_parser().parse_args(["--cpu", "--config_file", path, "x"]))
    assert GPU_REQUIRED_VARIABLE not in os.environ


def test_the_course_config_refuses_a_machine_without_gpu_before_reading_anything(
    no_gpu_visible, tmp_path, capsys
):
    cache_dir, output_dir = tmp_path / "cache", tmp_path / "run"
    argv = ["--config", str(COURSE_CONFIG), "--cache_dir", str(cache_dir)]
    assert main([*argv, "--output_dir", str(output_dir)]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("error: no usable GPU: CUDA_VISIBLE_DEVICES is empty")
    assert not cache_dir.exists() and not output_dir.exists()


@pytest.mark.slow
def test_the_launcher_with_a_gpu_config_refuses_a_machine_without_gpu(tmp_path):
    """The accelerate config alone means the GPU: the training config here does not."""
    command = [
        sys.executable, "-m", "pretrain.launch",
        "--config_file", str(ACCELERATE_CONFIGS / "single_gpu.yaml"),
        str(RUN_SCRIPT), "--config", str(TINY_CONFIG), "--use_cpu", "false",
        "--cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "run"),
    ]  # fmt: skip
    result = subprocess.run(
        command,
        env={**subprocess_env(), "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    (error,) = result.stderr.splitlines()
    assert error.startswith("error: no usable GPU: CUDA_VISIBLE_DEVICES is empty")
    assert error.endswith(
        "accelerate_configs/single_gpu.yaml asks for a GPU (to train on the CPU instead, pass "
        "--use_cpu true)"
    )
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()
