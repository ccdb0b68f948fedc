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


def transformer_engine_version() -> str | None:
    """The installed transformer-engine version (read from its metadata, without importing TE)."""
    try:
        return importlib.metadata.version("transformer_engine")
    except importlib.metadata.PackageNotFoundError:
        return None


def transformer_engine_status() -> str:
    """The installed TE and what serves the TE families in this run (the active --te-impl)."""
    from te_verify import te_api

    impl = te_api.active()
    version = transformer_engine_version()
    installed = version if version else "absent: not installed"
    return installed if impl.runs_te_python else f"{installed} (not under test: --te-impl {impl.name})"


def device() -> str:
    """The run's device (--device), kind first: "cuda: NVIDIA H100 80GB HBM3 x8" or "cpu: x86_64"."""
    from te_verify import device as run_device

    active = run_device.active()
    if active.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(active)} x{torch.cuda.device_count()}"
    return f"cpu: {platform.processor() or platform.machine()}"


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "thunder": _version("lightning-thunder"),
        "fairscale": _version("fairscale"),
        "transformer_engine": transformer_engine_status(),
    }
