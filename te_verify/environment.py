"""What the run header says about this machine: versions, device, TE status."""
from __future__ import annotations

import importlib.metadata
import platform

import torch


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent: not installed"


def transformer_engine_status() -> str:
    """TE's version when `transformer_engine.pytorch` imports, else "absent: <TE's own reason>"."""
    try:
        import transformer_engine  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # TE raises ImportError, RuntimeError or OSError when CUDA libraries are missing
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"absent: {type(exc).__name__}: {reason}"
    return _version("transformer-engine")


def device() -> str:
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return f"cpu: {platform.processor() or platform.machine()}"


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "thunder": _version("lightning-thunder"),
        "fairscale": _version("fairscale"),
        "transformer_engine": transformer_engine_status(),
    }
