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


# Every distribution whose code a case of a run may execute, by the name the header shows (read from the installed
# metadata, never by importing: importing some of them takes seconds). A changed version between two runs is what
# `te-verify report diff` names, and what `--resume` refuses to mix.
UNDER_TEST: dict[str, str] = {
    "thunder": "lightning-thunder",
    "fairscale": "fairscale",
    "megatron-core": "megatron-core",
    "megatron-fsdp": "megatron-fsdp",
    "deepspeed": "deepspeed",
    "transformers": "transformers",
    "peft": "peft",
    "litgpt": "litgpt",
    "pytest": "pytest",
    "pytest-xdist": "pytest-xdist",
    "hypothesis": "hypothesis",
}


def versions() -> dict[str, str]:
    """python, torch, TE (and whether its Python is under test) and every distribution of UNDER_TEST."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformer_engine": transformer_engine_status(),
        **{name: _version(dist) for name, dist in UNDER_TEST.items()},
    }
