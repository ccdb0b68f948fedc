"""A planted TE build: TE's own `Linear`, whose weight-gradient GEMM computes every weight gradient WGRAD_ERROR too
large, wherever that gradient goes (or, `gradient_gemm_off_by(factor, "dgrad")`, whose dgrad GEMM computes every input
gradient `factor` too large: the issue-25 lean of a bf16 dgrad 1% too large).

The fault sits in TE's Python, in the GEMM `_Linear`'s backward calls for dw = dy^T x (the `general_gemm` call of
transformer_engine.pytorch.module.linear with layout "NT" and grad=True; TE >= 2.20): a returned wgrad is scaled;
one accumulated into `main_grad` (fuse_wgrad_accumulation) has its increment scaled; a delayed one (delay_wgrad_compute)
is computed by the same closure when `backward_dw()` runs, so it is scaled then. Everything else is TE's real code over
the active --te-impl; te.ops and GroupedLinear are other code, untouched.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch

from te_verify.te import api as te_api

WGRAD_ERROR = 1.05
# general_gemm's layout in _Linear's backward, by role (grad=True): dw = dy^T x is "NT", dx = dy W is "NN".
LAYOUTS = {"wgrad": "NT", "dgrad": "NN"}


def wgrad_off_by(factor: float = WGRAD_ERROR) -> contextlib.AbstractContextManager:
    """Inside the block TE's Linear computes factor x every weight gradient (the active --te-impl runs TE's Python)."""
    return gradient_gemm_off_by(factor, "wgrad")


@contextlib.contextmanager
def gradient_gemm_off_by(factor: float, role: str) -> Iterator[None]:
    """Inside the block TE's Linear's `role` GEMM ("wgrad" or "dgrad") returns factor x its result."""
    te_api.active().api  # boots the tex emulation where that is the implementation, before TE is imported
    from transformer_engine.pytorch.module import linear

    original = getattr(linear, "general_gemm", None)
    if original is None:
        raise RuntimeError("planted_te_wgrad: this TE's module.linear calls no general_gemm to plant the fault in")

    def planted(*args, **kwargs):
        if kwargs.get("grad") is not True or kwargs.get("layout") != LAYOUTS[role]:
            return original(*args, **kwargs)
        into = kwargs.get("out")
        before = into.detach().clone() if into is not None and kwargs.get("accumulate") else None
        result, *rest = original(*args, **kwargs)
        if into is not None:  # written in place (main_grad): scale what this GEMM added
            with torch.no_grad():
                into.copy_(before + factor * (into - before) if before is not None else factor * into)
            return (result, *rest)
        return (result * factor, *rest)

    linear.general_gemm = planted
    try:
        yield
    finally:
        linear.general_gemm = original


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """As a pytest plugin (`-p planted_te_wgrad`, tests/ on the path), every test runs on the planted build."""
    with wgrad_off_by():
        return (yield)
