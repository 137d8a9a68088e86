"""Precision is decided once: the accelerate launcher, else our flags, else the hardware. The
CPU processes' rules hold on every machine; a GPU machine also checks its own choice."""

import pytest
import torch
from transformers import TrainingArguments

from common.cli import InputError
from pretrain.args import LAUNCHER_PRECISION_VARIABLE, resolve_precision


def cpu_arguments(tmp_path, **kwargs) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **kwargs)


def test_cpu_without_any_setting_trains_in_fp32(tmp_path, monkeypatch):
    monkeypatch.delenv(LAUNCHER_PRECISION_VARIABLE, raising=False)
    choice = resolve_precision(cpu_arguments(tmp_path))
    assert (choice.mixed_precision, choice.tf32) == ("no", False)
    assert choice.source.startswith("automatic")


def test_launcher_no_means_undecided_and_a_flag_decides(tmp_path, monkeypatch):
    monkeypatch.setenv(LAUNCHER_PRECISION_VARIABLE, "no")  # what `accelerate launch` always sets
    arguments = cpu_arguments(tmp_path, bf16=True)
    choice = resolve_precision(arguments)
    assert (choice.mixed_precision, choice.source) == ("bf16", "--bf16")
    assert arguments.mixed_precision == "bf16" and arguments.bf16 and not arguments.fp16


def test_the_accelerate_config_decides_when_it_names_a_precision(tmp_path, monkeypatch):
    monkeypatch.setenv(LAUNCHER_PRECISION_VARIABLE, "fp16")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # a CPU launch (--cpu, cpu.yaml)
    arguments = cpu_arguments(tmp_path)
    choice = resolve_precision(arguments)
    assert (choice.mixed_precision, choice.source) == ("fp16", "accelerate config")
    assert arguments.fp16 and arguments.mixed_precision == "fp16"


def test_a_gpu_config_s_precision_on_the_cpu_is_fp32_as_the_slurm_scripts_train(
    tmp_path, monkeypatch
):
    """single_gpu.yaml's bf16 with --use_cpu true, as `USE_CPU=true sbatch` (--mixed_precision
    no): fp32 both ways."""
    monkeypatch.setenv(LAUNCHER_PRECISION_VARIABLE, "bf16")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    choice = resolve_precision(cpu_arguments(tmp_path))
    assert (choice.mixed_precision, choice.source) == ("no", "automatic (cpu: fp32)")


def test_two_different_precisions_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(LAUNCHER_PRECISION_VARIABLE, "bf16")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    with pytest.raises(InputError, match="accelerate config says bf16 and the command line says"):
        resolve_precision(cpu_arguments(tmp_path, fp16=True))


@pytest.mark.system
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_without_any_setting_trains_in_its_best_16_bit_precision(tmp_path, monkeypatch):
    monkeypatch.delenv(LAUNCHER_PRECISION_VARIABLE, raising=False)
    arguments = TrainingArguments(output_dir=str(tmp_path))
    choice = resolve_precision(arguments)
    ampere_or_newer = torch.cuda.get_device_capability()[0] >= 8
    assert choice.mixed_precision == ("bf16" if ampere_or_newer else "fp16")
    assert choice.tf32 is ampere_or_newer and choice.source.startswith("automatic")
