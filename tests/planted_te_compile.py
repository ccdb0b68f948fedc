"""Planted faults in TE's torch.compile path (TE 2.20's module/linear.py), for torch >= 2.14 where the path runs.

- `compiled_wgrad_for_frozen()`: TE's custom op is handed `weight_requires_grad=True` for every layer, so its
  backward op (bwd_args.requires_wgrad = fwd_args.weight_requires_grad) issues the wgrad GEMM for a frozen weight
  too. The gradient is dropped by autograd (the weight needs none): only the GEMM record shows the waste. Eager TE and
  TE's fallback are untouched (the plant wraps the compiled op only).
- `falls_back_where_te_compiles(reason)`: te.Linear takes its eager fallback (graph break, TE's warning) for every
  configuration, as a TE whose compiled path broke for a configuration it claims to support would.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from te_verify.te import api as te_api

PLANTED_REASON = "planted: a fallback TE's code does not take"


def _linear_module():
    te_api.active().api  # boots the tex emulation where that is the implementation, before TE is imported
    from transformer_engine.pytorch.module import linear

    if getattr(linear, "_linear_op", None) is None:
        raise RuntimeError("planted_te_compile: TE's compiled op is not registered here (torch < 2.14?)")
    return linear


@contextlib.contextmanager
def compiled_wgrad_for_frozen() -> Iterator[None]:
    """Inside the block, TE's compiled te.Linear computes the weight gradient of a frozen weight."""
    linear = _linear_module()
    original = linear._linear_op

    def planted(fwd_args):
        fwd_args.weight_requires_grad = True
        return original(fwd_args)

    linear._linear_op = planted
    try:
        yield
    finally:
        linear._linear_op = original


@contextlib.contextmanager
def falls_back_where_te_compiles(reason: str = PLANTED_REASON) -> Iterator[None]:
    """Inside the block, every te.Linear call under torch.compile takes TE's eager fallback, giving `reason`."""
    linear = _linear_module()
    original = linear.Linear._compile_eager_fallback_reason
    linear.Linear._compile_eager_fallback_reason = lambda self, *args, **kwargs: reason
    try:
        yield
    finally:
        linear.Linear._compile_eager_fallback_reason = original
