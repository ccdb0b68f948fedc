"""TE's GELU jit fusions with their compiled kernel's numerics (a compatibility step of te_import's boot).

TE decorates its bias+GELU functions (jit.py: LayerNormMLP's forward without a GEMM epilogue, and its backward) with
`jit_fuser`, torch.compile on a GPU. The boot imports TE with NVTE_TORCH_COMPILE=0 (inductor's CPU build took
20-45 s a shape here), so they run as plain eager torch, which on BF16/FP16 tensors rounds after every op: the
tanh-GELU of TE 2.20.2's LayerNormMLP in BF16 then differs from the compiled kernel's in most elements (TE's
test_identity_quantizer: the BF16 path and the identity-recipe path, which calls tex.gelu, differ in 599 of 1,024
outputs). The compiled kernel loads half-precision inputs as fp32, computes in fp32 and rounds once at the store
(inductor's codegen for reduced-precision pointwise math, its bias-gradient sum included); so does each function
here: on fp32 copies of its half-precision tensor arguments, each output cast once to the arguments' promoted dtype.

Only these four: TE's L2 normalization fusions compute in fp32 as written, and bias_dropout_add draws its mask from
inductor's RNG on a GPU, which no eager run reproduces. A TE version lacking one of them fails the boot naming it.
"""
from __future__ import annotations

import functools
import types
from typing import Any, Callable

import torch

FUSIONS = ("bias_gelu_fused_", "gelu_fused_", "bgrad_dgelu_fused_", "dgelu_fused_")
_HALF = (torch.bfloat16, torch.float16)


class MissingFusion(RuntimeError):
    """TE's jit.py lacks a function this step replaces."""


def compiled_numerics(function: Callable) -> Callable:
    """`function` run in fp32 on half-precision tensor arguments, each tensor output rounded once."""
    @functools.wraps(function)
    def run(*args: Any) -> Any:
        dtypes = [a.dtype for a in args if isinstance(a, torch.Tensor)]
        if not any(d in _HALF for d in dtypes):
            return function(*args)
        out_dtype = functools.reduce(torch.promote_types, dtypes)
        result = function(*(a.float() if isinstance(a, torch.Tensor) and a.dtype in _HALF else a for a in args))
        if isinstance(result, tuple):
            return tuple(r.to(out_dtype) if isinstance(r, torch.Tensor) else r for r in result)
        return result.to(out_dtype)
    return run


def patch(jit: types.ModuleType) -> None:
    """Replace the four functions in TE's jit module as soon as it has executed (before any module imports them)."""
    missing = [name for name in FUSIONS if not callable(getattr(jit, name, None))]
    if missing:
        raise MissingFusion(f"te_verify.te.tecpu: {jit.__name__} has no {', '.join(missing)}; the GELU fusions' "
                            f"compiled numerics (jit_fusions.py) were measured on TE 2.14-2.20")
    for name in FUSIONS:
        setattr(jit, name, compiled_numerics(getattr(jit, name)))
