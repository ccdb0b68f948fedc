"""TE's GEMM calls patched, for TE builds in tests (split_k_te_build, the planted recompute): TE 2.20's own Python over
the tex emulation, with `general_gemm` (cpp_extensions.gemm) replaced where TE's modules call it. "split_k" issues
two tex.generic_gemm calls, each over one half of K (fprop: the input features; dgrad: the output features; wgrad:
the rows), the second accumulating into the first's fp32 output. The halves are views of the operands (of an FP8
copy: of its data and transpose buffers, each half a multiple of 16 long as cuBLAS's FP8 GEMM needs), so the record
at the tex boundary sees two GEMMs per layer and role over slices of what the whole GEMM would read. A GEMM that
cannot be split so (K too short, an output quantizer, a GELU or userbuffers epilogue, a bias gradient over anything
but the rows) runs whole. GroupedLinear's grouped GEMMs run whole.

Planted faults: "recompute" runs every fprop GEMM twice, the first result thrown away; "dequantized" runs FP8 GEMMs
on fp32 copies of their operands. `install(mode)` patches
the call sites for the process (a --te-impl module), `patched(mode)` for a block.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
from types import SimpleNamespace
from typing import Any, Iterator

import torch

from te_verify.te import api as te_api
from te_verify.te.tecpu.gemm import output_shape
from te_verify.te.tecpu.record import TEX_MODULE
from te_verify.te.tecpu.te_classes import shape_of


@functools.cache
def te_python_api() -> SimpleNamespace:
    """TE's Python over the tex emulation (booting it and importing TE on first call; emulated sm90)."""
    return te_api.resolve(te_api.CPU_CHOICE).api


te_python_api()
from transformer_engine.pytorch.constants import TE_DType  # noqa: E402
from transformer_engine.pytorch.cpp_extensions import gemm as _gemm  # noqa: E402
from transformer_engine.pytorch.tensor.storage.float8_tensor_storage import Float8TensorStorage  # noqa: E402

# TE's modules that bound `general_gemm` at import (the ones the TE families run).
CALLERS = ("transformer_engine.pytorch.cpp_extensions", "transformer_engine.pytorch.module.linear",
           "transformer_engine.pytorch.module.layernorm_linear", "transformer_engine.pytorch.module.layernorm_mlp",
           "transformer_engine.pytorch.ops.basic.basic_linear")
ORIGINAL = _gemm.general_gemm
SIGNATURE = inspect.signature(ORIGINAL)
FP8_ALIGN = 16  # cuBLAS's FP8 GEMM needs K a multiple of 16 (tecpu.gemm._check_fp8_ld)


def _half(k: int, fp8: bool) -> int:
    """Where to cut K: its middle, on a multiple of 16 for FP8; 0 where it cannot be cut."""
    if not fp8:
        return k // 2
    return FP8_ALIGN * (k // FP8_ALIGN // 2) if k % FP8_ALIGN == 0 else 0


def _slice(t: Any, cut_columns: bool, part: slice) -> Any:
    """Rows or columns `part` of the logical 2-D operand, as views (an FP8 copy's data and transpose alike)."""
    if not isinstance(t, Float8TensorStorage):
        t2 = t.reshape(-1, t.shape[-1])
        return t2[:, part] if cut_columns else t2[part]
    data = t._data.reshape(-1, t._data.shape[-1]) if t._data is not None else None
    valid = t._transpose is not None and not t._transpose_invalid
    transpose = t._transpose.reshape(t._transpose.shape[0], -1) if valid else None  # logical last dim first
    if data is not None:
        data = data[:, part] if cut_columns else data[part]
    if transpose is not None:
        transpose = transpose[part] if cut_columns else transpose[:, part]
    return Float8TensorStorage(data=data, fp8_scale_inv=t._scale_inv, fp8_dtype=t._fp8_dtype, fake_dtype=t._dtype,
                               data_transpose=transpose, quantizer=None, transpose_invalid=transpose is None)


def _splits(args: dict) -> tuple[int, int] | None:
    """(K, where to cut it) for a GEMM this build splits, else None."""
    a, b, layout = args["A"], args["B"], args["layout"]
    operands_ok = all(isinstance(t, Float8TensorStorage) or type(t) in (torch.Tensor, torch.nn.Parameter)
                      for t in (a, b))
    epilogue_ok = (args["quantization_params"] is None and not args["gelu"] and args["ub"] is None
                   and args["extra_output"] is None and not args["bulk_overlap"]
                   and (args["out_dtype"] is not None or args["out"] is not None)
                   and not (args["grad"] and args["bias"] is not None and layout != "NT"))
    if not (operands_ok and epilogue_ok):
        return None
    rows, cols = _dims2(shape_of(a))
    k = cols if layout[0] == "T" else rows
    cut = _half(k, isinstance(a, Float8TensorStorage))
    return (k, cut) if cut else None


def _dims2(shape: tuple) -> tuple[int, int]:
    return int(torch.Size(shape[:-1]).numel()), shape[-1]


def split_k_gemm(*args: Any, **kwargs: Any):
    """general_gemm as two half-K GEMMs (see the module docstring); whole where it cannot split."""
    call = SIGNATURE.bind(*args, **kwargs)
    call.apply_defaults()
    p = dict(call.arguments)
    found = _splits(p)
    if found is None:
        return ORIGINAL(**p)
    k, cut = found
    transa, transb = p["layout"][0] == "T", p["layout"][1] == "T"
    first, second = slice(0, cut), slice(cut, k)
    a1, a2 = (_slice(p["A"], transa, s) for s in (first, second))
    b1, b2 = (_slice(p["B"], not transb, s) for s in (first, second))
    out, dtype = p["out"], p["out_dtype"] or p["out"].dtype
    accumulate_dtype = dtype if out is not None else torch.float32
    d, bias_grad, *_ = ORIGINAL(**{**p, "A": a1, "B": b1, "out_dtype": accumulate_dtype})
    _, bias_grad2, *_ = ORIGINAL(**{**p, "A": a2, "B": b2, "out_dtype": accumulate_dtype, "out": d,
                                    "accumulate": True, "beta": None,
                                    "bias": p["bias"] if p["grad"] else None})
    if bias_grad is not None and bias_grad2 is not None:
        bias_grad = (bias_grad + bias_grad2).to(dtype)
    if out is None:
        d = d.to(dtype).reshape(output_shape(shape_of(p["A"]), transa, shape_of(p["B"]), transb))
    return d, bias_grad, None, None


def recompute_gemm(*args: Any, **kwargs: Any):
    """general_gemm, with every forward (TN) GEMM run once more first and its result thrown away."""
    call = SIGNATURE.bind(*args, **kwargs)
    call.apply_defaults()
    if call.arguments["layout"] == "TN" and call.arguments["out"] is None:
        ORIGINAL(*call.args, **call.kwargs)
    return ORIGINAL(*call.args, **call.kwargs)


def dequantized_gemm(*args: Any, **kwargs: Any):
    """general_gemm with FP8 operands dequantized to fp32 first (by tex, so the record follows the copies): the same
    FLOPs over four times the operand bytes."""
    call = SIGNATURE.bind(*args, **kwargs)
    call.apply_defaults()
    p = dict(call.arguments)
    if isinstance(p["A"], Float8TensorStorage) and isinstance(p["B"], Float8TensorStorage):
        tex = sys.modules[TEX_MODULE]  # looked up per call: the record wraps the module's functions
        p["A"], p["B"] = (tex.dequantize(t, TE_DType[torch.float32]) for t in (p["A"], p["B"]))
    return ORIGINAL(**p)


GEMMS = {"split_k": split_k_gemm, "recompute": recompute_gemm, "dequantized": dequantized_gemm, "te": ORIGINAL}


def install(mode: str) -> None:
    """Point every TE call site of general_gemm at `mode`'s GEMM."""
    for name in CALLERS:
        module = importlib.import_module(name)
        if hasattr(module, "general_gemm"):
            module.general_gemm = GEMMS[mode]


@contextlib.contextmanager
def patched(mode: str) -> Iterator[None]:
    """`mode`'s GEMM for a block, then TE's own again."""
    install(mode)
    try:
        yield
    finally:
        install("te")
