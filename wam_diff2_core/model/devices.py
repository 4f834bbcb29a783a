"""Devices and dtypes: ``auto`` resolved once, the same way for loading, benchmarks and training.

    device = resolve_device("auto")                       # cuda, then an Ascend npu, then cpu
    dtype = resolve_dtype("auto", device, parameters)     # bfloat16 on accelerators; see CPU_BF16_MIN_PARAMETERS
"""
from __future__ import annotations

import torch

from ..config import DEVICES, DTYPE_ALIASES, DTYPE_NAMES, ConfigError


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks cuda, then an Ascend npu (torch-npu, imported only then), then cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "npu" if _npu_available() else "cpu")
    if device.startswith("npu"):
        if not _npu_available():
            raise ConfigError("device: npu needs torch-npu and Ascend CANN (pip install .[npu])")
    elif device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device: {device} requested but CUDA is not available")
    elif device.split(":")[0] not in DEVICES[1:]:
        raise ConfigError(f"device: {device!r} is not one of {', '.join(DEVICES)}")
    return torch.device(device)


def rank_device(device: str, local_rank: int) -> str:
    """Accelerator ``local_rank`` of a torchrun run, made the process's current device (else every rank lands on
    device 0); ``cpu`` stays ``cpu``, an explicit index (``cuda:1``) is kept."""
    kind = resolve_device(device).type
    if kind == "cpu":
        return "cpu"
    index = int(device.split(":")[1]) if ":" in device else local_rank
    getattr(torch, kind).set_device(index)          # torch.cuda / torch.npu (torch-npu)
    return f"{kind}:{index}"


def _npu_available() -> bool:
    try:
        import torch_npu  # noqa: F401  (registers the npu device)
    except ImportError:
        return False
    return hasattr(torch, "npu") and torch.npu.is_available()


DTYPES = {name: getattr(torch, DTYPE_ALIASES.get(name, name)) for name in DTYPE_NAMES}


# On CPU, ``auto`` keeps float32 (bit-exact tests, small models) below this many parameters and
# uses bfloat16 above it where the CPU has bf16 kernels: a 2B model in float32 needs twice the memory
# of bf16 and a slower prefill (docs/checkpoints.md, "Memory and time").
CPU_BF16_MIN_PARAMETERS = 500_000_000


def cpu_supports_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_dtype(dtype: str, device: torch.device, parameters: int = 0) -> torch.dtype:
    """``auto``: bfloat16 on accelerators; on CPU float32, or bfloat16 for a model of at least
    :data:`CPU_BF16_MIN_PARAMETERS` parameters when the CPU supports it."""
    if dtype == "auto":
        bf16 = device.type != "cpu" or (parameters >= CPU_BF16_MIN_PARAMETERS and cpu_supports_bf16())
        return torch.bfloat16 if bf16 else torch.float32
    if dtype not in DTYPES:
        raise ConfigError(f"dtype: {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]
