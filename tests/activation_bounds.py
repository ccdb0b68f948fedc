"""Shared by the exactness tests of tex's activations against their fp64 definitions: the elementwise bound and
tex's positional call."""
from __future__ import annotations

from typing import Callable

import pytest
import torch


def assert_within(got: torch.Tensor, want: torch.Tensor, floor: torch.Tensor, what: str) -> None:
    """Every element within |want| x (a rounding of got's dtype, fp32 kernels' few more in bf16) + `floor` (the
    calling test's magnitude term), the first offender named."""
    err = (got.double() - want).abs()
    rel = 2.0 ** -8 + 1e-6 if got.dtype == torch.bfloat16 else 2.0 ** -20
    bad = err > want.abs() * rel + floor
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        pytest.fail(f"{what}: {int(bad.sum())} of {got.numel()} elements beyond the bound, first at {first}: "
                    f"{float(got[first])} vs {float(want[first])}")


def call(fn: Callable, params: tuple | None, *args: torch.Tensor) -> torch.Tensor:
    """tex's call: positional parameters, or none (pybind's defaults)."""
    return fn(*args, None) if params is None else fn(*args, None, *params)
