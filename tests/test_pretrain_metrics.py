"""Metrics: the peak FLOP/s table, the no-op GPU readings without a GPU, and what a process
holds (parameters once each, AdamW's state, master copies, the peak)."""

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from common.run_contract import GPU_MEMORY_USED, GPU_POWER, GPU_UTILIZATION, NVIDIA_SMI_FILE
from pretrain.metrics import (
    GpuReadings,
    accelerator_name,
    job_peak_flops_per_second,
    parameter_bytes,
    peak_flops_per_second,
    peak_memory,
    rank_footprint,
    write_nvidia_smi_snapshot,
)

FP32_BYTES = 4


@pytest.fixture
def model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=128)
    return GPT2LMHeadModel(config)


def take_one_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    input_ids = torch.randint(0, 128, (2, 16))
    model(input_ids=input_ids, labels=input_ids).loss.backward()
    optimizer.step()


def test_tied_weight_counts_once(model):
    assert model.lm_head.weight is model.transformer.wte.weight
    num_elements = sum(p.numel() for p in model.parameters())  # distinct parameters
    record = rank_footprint(model, torch.optim.AdamW(model.parameters()), torch.device("cpu"))
    assert record["parameter_bytes"] == num_elements * FP32_BYTES
    assert parameter_bytes([model.lm_head.weight, model.transformer.wte.weight]) == (
        model.lm_head.weight.numel() * FP32_BYTES
    )


def test_adamw_state_is_two_moments_and_a_step_per_parameter(model):
    optimizer = torch.optim.AdamW(model.parameters())
    assert rank_footprint(model, optimizer, torch.device("cpu"))["optimizer_state_bytes"] == 0
    take_one_step(model, optimizer)
    record = rank_footprint(model, optimizer, torch.device("cpu"))
    num_tensors = len(list(model.parameters()))
    assert record["optimizer_state_bytes"] == (
        2 * record["parameter_bytes"] + num_tensors * FP32_BYTES  # exp_avg, exp_avg_sq, step
    )


def test_master_copies_of_a_half_precision_model_count_as_optimizer_state(model):
    model.to(torch.bfloat16)
    master_copies = [p.detach().float().requires_grad_() for p in model.parameters()]
    optimizer = torch.optim.AdamW(master_copies)
    for copy in master_copies:
        copy.grad = torch.ones_like(copy)
    optimizer.step()
    record = rank_footprint(model, optimizer, torch.device("cpu"))
    num_elements = sum(p.numel() for p in model.parameters())
    assert record["parameter_bytes"] == num_elements * 2  # bf16
    # fp32 master weights + two fp32 moments per element + one step per tensor.
    assert record["optimizer_state_bytes"] == (
        3 * num_elements * FP32_BYTES + len(master_copies) * FP32_BYTES
    )


def test_peak_memory_of_a_cpu_process_is_its_resident_set(model):
    record = rank_footprint(model, torch.optim.AdamW(model.parameters()), torch.device("cpu"))
    assert record["peak_memory_source"] == "process_max_rss"
    # The interpreter and torch alone take tens of MiB; no process holds a terabyte.
    assert 20 * 2**20 < record["peak_memory_bytes"] < 2**40
    assert record["rank"] == 0


@pytest.mark.parametrize(
    ("device_name", "tflops"),
    [
        ("NVIDIA H200", 989.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A10", 125.0),  # not the A100's entry
        ("NVIDIA L4", 121.0),  # not the L40's
        ("NVIDIA GeForce RTX 2080 Ti", 53.8),
        ("Tesla T4", 65.0),
        ("NVIDIA GeForce GTX 1080", None),
        ("cpu", None),
    ],
)
def test_peak_flops_are_looked_up_by_device_name(device_name, tflops):
    peak = peak_flops_per_second(device_name)
    assert peak == (None if tflops is None else pytest.approx(tflops * 1e12))


def test_the_job_peak_is_one_device_s_times_the_devices():
    cpu = torch.device("cpu")
    assert job_peak_flops_per_second(None, cpu, num_devices=4) is None  # no peak known on CPU
    assert job_peak_flops_per_second(2.0, cpu, num_devices=4) == pytest.approx(8e12)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_without_a_gpu_sampling_and_snapshot_do_nothing(tmp_path):
    assert GpuReadings(torch.device("cpu")).read() == {}
    assert accelerator_name(torch.device("cpu")) == "cpu"
    assert peak_memory(torch.device("cpu"))[1] == "process_max_rss"
    assert write_nvidia_smi_snapshot(tmp_path / NVIDIA_SMI_FILE) is False
    assert not (tmp_path / NVIDIA_SMI_FILE).exists()


@pytest.mark.system
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_with_a_gpu_sampling_reads_the_three_tags(tmp_path):
    device = torch.device("cuda", torch.cuda.current_device())
    assert accelerator_name(device) == torch.cuda.get_device_name(device)
    torch.ones(2**28, dtype=torch.uint8, device=device)  # 0.25 GiB held at once
    assert peak_memory(device) >= (2**28, "cuda_max_memory_allocated")
    readings = GpuReadings(device).read()
    assert set(readings) == {GPU_UTILIZATION, GPU_MEMORY_USED, GPU_POWER}
    assert 0 <= readings[GPU_UTILIZATION] <= 100
    assert write_nvidia_smi_snapshot(tmp_path / NVIDIA_SMI_FILE)
    assert "NVIDIA-SMI" in (tmp_path / NVIDIA_SMI_FILE).read_text()
