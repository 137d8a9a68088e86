"""What the GPU is doing: its readings (utilisation, memory, power), an `nvidia-smi` snapshot,
its name and peak FLOP/s.

Every function here is a no-op (or returns None) on a machine without an NVIDIA GPU, so
training code calls them unconditionally.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

import torch

from common.run_contract import GPU_MEMORY_USED, GPU_POWER, GPU_UTILIZATION

logger = logging.getLogger(__name__)

# Dense (no sparsity) 16-bit tensor-core peak with FP32 accumulation, TFLOP/s, from the vendor
# datasheets. MFU is reported against this number whatever the precision, as is customary
# (PaLM, nanoGPT); a GPU not listed here gets MFU only with an explicit peak. First match wins,
# so variants come before the plain name: a device name matches an entry when it contains all
# of the entry's words.
PEAK_TFLOPS_16BIT: tuple[tuple[tuple[str, ...], float], ...] = (
    (("B200",), 2250.0),
    (("GH200",), 989.0),
    (("H200", "NVL"), 835.0),
    (("H200",), 989.0),
    (("H100", "PCIe"), 756.0),
    (("H100", "NVL"), 835.0),
    (("H100",), 989.0),
    (("H800",), 989.0),
    (("A100",), 312.0),
    (("A800",), 312.0),
    (("L40S",), 362.0),
    (("L40",), 181.0),
    (("L4",), 121.0),
    (("A10",), 125.0),
    (("A6000",), 154.8),
    (("4090",), 165.2),
    (("3090",), 71.0),
    # GeForce Turing runs FP16 with FP32 accumulation at half the Quadro/Titan rate.
    (("2080", "Ti"), 53.8),
    (("V100",), 125.0),
    (("T4",), 65.0),
)


def accelerator_name(device: torch.device) -> str:
    """The accelerator's marketing name ("NVIDIA H200"), or the device type ("cpu")."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def job_peak_flops_per_second(
    peak_tflops: float | None, device: torch.device, num_devices: int
) -> float | None:
    """The whole job's peak FLOP/s: one device's (`peak_tflops` when given, else looked up by
    the GPU's name) times the devices, each running the model on its share of the batch."""
    if peak_tflops:
        one_device = peak_tflops * 1e12
    else:
        one_device = peak_flops_per_second(accelerator_name(device))
    return None if one_device is None else one_device * num_devices


def peak_flops_per_second(device_name: str) -> float | None:
    """Dense 16-bit peak FLOP/s of a GPU named like `torch.cuda.get_device_name()`, or None."""
    words = set(re.split(r"[\s\-_]+", device_name))
    for required, tflops in PEAK_TFLOPS_16BIT:
        if all(word in words for word in required):
            return tflops * 1e12
    return None


class GpuReadings:
    """Utilisation, memory in use and power draw of one CUDA device, keyed by TensorBoard tag.

    torch.cuda reads them through NVML (and finds the device NVML numbers differently under
    CUDA_VISIBLE_DEVICES); without a GPU `read()` returns an empty dict, and the first failed
    reading (no NVML library) says so once and stops the readings.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device if device.type == "cuda" else None

    def read(self) -> dict[str, float]:
        """Current utilisation (%), memory in use on the device (GiB) and power draw (W)."""
        if self.device is None:
            return {}
        try:
            free_bytes, total_bytes = torch.cuda.mem_get_info(self.device)
            return {
                GPU_UTILIZATION: float(torch.cuda.utilization(self.device)),
                GPU_MEMORY_USED: (total_bytes - free_bytes) / 2**30,
                GPU_POWER: torch.cuda.power_draw(self.device) / 1000.0,
            }
        except Exception as err:  # noqa: BLE001 (no NVML library, or a driver too old for it)
            logger.warning("GPU readings stopped: %s", err)
            self.device = None
            return {}


def write_nvidia_smi_snapshot(path: str | Path) -> bool:
    """Save the output of `nvidia-smi` to `path`; False (nothing written) without one."""
    executable = shutil.which("nvidia-smi")
    if executable is None or not torch.cuda.is_available():
        return False
    try:
        result = subprocess.run(
            [executable], capture_output=True, text=True, timeout=30, check=True
        )
    except (subprocess.SubprocessError, OSError) as err:
        logger.warning("nvidia-smi snapshot failed: %s", err)
        return False
    path = Path(path)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(result.stdout, encoding="utf-8")
    partial.replace(path)
    return True
