"""What the run header says about this machine: versions, device, TE status."""
from __future__ import annotations

import importlib.metadata
import platform

import torch

from te_verify import device as run_device
from te_verify.te import api as te_api
from te_verify.te.api import transformer_engine_version


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent: not installed"


def transformer_engine_status() -> str:
    """The installed TE and what serves the TE families in this run (the active --te-impl)."""
    impl = te_api.active()
    version = transformer_engine_version()
    installed = version if version else "absent: not installed"
    return installed if impl.runs_te_python else f"{installed} (not under test: --te-impl {impl.name})"


def device() -> str:
    """The run's device (--device), kind first: "cuda: NVIDIA H100 80GB HBM3 x8" or "cpu: x86_64"."""
    return run_device.describe()


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "thunder": _version("lightning-thunder"),
        "fairscale": _version("fairscale"),
        "transformer_engine": transformer_engine_status(),
    }
