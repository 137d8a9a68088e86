"""What the GPU is doing: NVML readings, an `nvidia-smi` snapshot, its name, peak FLOP/s and the
most memory the run's tensors held.

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


def peak_memory_gib(device: torch.device) -> float | None:
    """The most GPU memory this process's tensors held at once (GiB); None on CPU."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def peak_flops_per_second(device_name: str) -> float | None:
    """Dense 16-bit peak FLOP/s of a GPU named like `torch.cuda.get_device_name()`, or None."""
    words = set(re.split(r"[\s\-_]+", device_name))
    for required, tflops in PEAK_TFLOPS_16BIT:
        if all(word in words for word in required):
            return tflops * 1e12
    return None


class GpuSampler:
    """NVML readings (utilisation, memory, power) of one CUDA device, keyed by TensorBoard tag.

    `GpuSampler()` watches the current CUDA device of this process; without a GPU or without
    the NVML library, `read()` returns an empty dict.
    """

    def __init__(self, device_index: int | None = None) -> None:
        self._handle = None
        self._nvml = None
        if not torch.cuda.is_available():
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = torch.cuda.current_device() if device_index is None else device_index
            self._handle = _nvml_handle(pynvml, torch.cuda.get_device_properties(index))
            self._nvml = pynvml
        except Exception as err:  # NVML missing or too old: sampling is optional
            logger.warning("GPU sampling disabled: NVML unavailable (%s)", err)
            self._handle = None

    @property
    def enabled(self) -> bool:
        return self._handle is not None

    def read(self) -> dict[str, float]:
        """Current utilisation (%), memory in use (GiB) and power draw (W); empty without a GPU."""
        if self._handle is None:
            return {}
        nvml = self._nvml
        try:
            utilization = nvml.nvmlDeviceGetUtilizationRates(self._handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(self._handle)
            power_milliwatts = nvml.nvmlDeviceGetPowerUsage(self._handle)
        except nvml.NVMLError as err:
            logger.warning("GPU sampling stopped: %s", err)
            self._handle = None
            return {}
        return {
            GPU_UTILIZATION: float(utilization.gpu),
            GPU_MEMORY_USED: memory.used / 2**30,
            GPU_POWER: power_milliwatts / 1000.0,
        }


def _nvml_handle(pynvml, properties):
    """NVML's handle for a CUDA device. NVML numbers GPUs physically, CUDA after
    CUDA_VISIBLE_DEVICES, so match by UUID, else by PCI address."""
    uuid = str(properties.uuid)
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except pynvml.NVMLError:
        bus_id = (
            f"{properties.pci_domain_id:08x}:{properties.pci_bus_id:02x}:"
            f"{properties.pci_device_id:02x}.0"
        )
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)


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
