"""A planted TE build: TE's own `Linear`, whose backward returns every weight gradient WGRAD_ERROR too large.

The fault sits in TE's Python, in the function `_Linear.backward` calls for its (wgrad, dgrad, bgrad)
(transformer_engine.pytorch.module.linear._linear_backward_impl, TE >= 2.20); everything else is TE's real code over
the active --te-impl. Paths whose wgrad does not leave through that return are untouched: fuse_wgrad_accumulation
(the GEMM writes main_grad itself; backward returns None or the dummy) and delay_wgrad_compute (the wgrad GEMM is
queued for backward_dw, backward returns None). te.ops and GroupedLinear are other code, also untouched.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from te_verify import te_api

WGRAD_ERROR = 1.05


@contextlib.contextmanager
def wgrad_off_by(factor: float = WGRAD_ERROR) -> Iterator[None]:
    """Inside the block TE's Linear returns factor x its weight gradient (the active --te-impl runs TE's Python)."""
    te_api.active().api  # boots the tex emulation where that is the implementation, before TE is imported
    from transformer_engine.pytorch.module import linear

    original = getattr(linear, "_linear_backward_impl", None)
    if original is None:
        raise RuntimeError("planted_te_wgrad: this TE has no module.linear._linear_backward_impl to plant the fault in")

    def planted(args):
        wgrad, dgrad, bgrad = original(args)
        if wgrad is not None and not args.fuse_wgrad_accumulation:
            wgrad = wgrad * factor
        return wgrad, dgrad, bgrad

    linear._linear_backward_impl = planted
    try:
        yield
    finally:
        linear._linear_backward_impl = original


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """As a pytest plugin (`-p planted_te_wgrad`, tests/ on the path), every test runs on the planted build."""
    with wgrad_off_by():
        return (yield)
