"""The emulated device's settings for a test, restored after it (te_verify/te/tecpu/device.py)."""
from __future__ import annotations

import contextlib
from typing import Iterator

from te_verify.te.tecpu import device


@contextlib.contextmanager
def capability(name: str) -> Iterator[None]:
    """Emulate `name` ("sm100") inside the block, then the capability the process had."""
    saved = device.capability_name()
    device.configure(name)
    try:
        yield
    finally:
        device.configure(saved)


@contextlib.contextmanager
def cublaslt(version: str) -> Iterator[None]:
    """Report cuBLASLt `version` ("13.4") inside the block, then the version the process had."""
    saved = device.cublaslt_version()
    device.configure_cublaslt(version)
    try:
        yield
    finally:
        device.configure_cublaslt(str(saved))
