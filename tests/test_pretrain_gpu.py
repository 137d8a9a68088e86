"""GPU helpers: the peak FLOP/s table and the no-op behaviour without a GPU."""

from __future__ import annotations

import pytest
import torch

from common.run_contract import GPU_MEMORY_USED, GPU_POWER, GPU_UTILIZATION, NVIDIA_SMI_FILE
from pretrain.footprint import peak_memory
from pretrain.gpu import (
    GpuReadings,
    accelerator_name,
    job_peak_flops_per_second,
    peak_flops_per_second,
    write_nvidia_smi_snapshot,
)


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
