"""Compatibility step for triton's interpreter under real_triton's "interpret" mode (measured on triton 3.9.0).

The interpreter stores bfloat16 as uint16 (numpy has no bfloat16) and computes on that storage: its `tl.dot` converts
only 8-bit float operands before `np.matmul`, so a bfloat16 dot multiplies the raw bit patterns (values near 1e10;
https://github.com/triton-lang/triton/issues/11584; the fix, PR 11585, was closed: "we just don't support it yet"),
and its elementwise arithmetic (`binary_op`, `unary_op`, `create_fma`: numpy on the uint16 data) does the same
(PR 10945, closed): `a * b` of two bfloat16 blocks gives 1e34 and inf. TE's mHC kernels take bfloat16 dots, and
`_mhc_aggregate_bwd` multiplies bfloat16 blocks (`grad_output * H_pre`), so their bfloat16 items of TE's tests failed
on it. The step widens bfloat16 operands to fp32 (exact) and rounds an arithmetic result back to bfloat16 (to nearest
even, NaN kept), as a GPU computes bfloat16 arithmetic: a dot accumulating in fp32; an elementwise product of two
bfloat16 values exact in fp32, one rounding; a sum, quotient or math function in fp32, then rounded (triton lowers
bfloat16 arithmetic through fp32 where the hardware has no bfloat16 instruction; a sum of two bfloat16 values rounds
the same either way). Only on the triton versions it was measured on (MEASURED), named in the header. Not covered:
reductions and scans (`tl.sum`, `tl.max` over a bfloat16 block: numpy on the bit patterns); kernels that use them fail
under the interpreter, which docs/te-lane.md sorts as the interpreter's.
"""
from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from packaging.specifiers import SpecifierSet

MEASURED = SpecifierSet(">=3.9,<3.10")
NOTE = ("bfloat16 tl.dot operands and elementwise arithmetic computed on fp32 values in the interpreter "
        "(triton-lang/triton#11584)")
_MARK = "_te_verify_bf16"  # set on the wrapped create_dot: the step is applied
# numpy functions binary_op applies whose result is a value of the operands' type (comparisons give truth values).
_ARITHMETIC = ("add", "subtract", "multiply", "divide", "fmod", "minimum", "maximum", "fmin", "fmax")


def apply(triton_version: str) -> str | None:
    """Wrap the interpreter's create_dot on the measured versions (once); returns the header's note, or None."""
    if triton_version not in MEASURED:
        return None
    interpreter = importlib.import_module("triton.runtime.interpreter")
    builder = interpreter.InterpreterBuilder
    if not getattr(builder.create_dot, _MARK, False):
        builder.create_dot = _bf16_as_fp32(builder.create_dot, interpreter)
        builder.binary_op = _elementwise(builder.binary_op, interpreter, _binary_arithmetic)
        builder.unary_op = _elementwise(builder.unary_op, interpreter, _always)
        builder.create_fma = _elementwise(builder.create_fma, interpreter, _always)
    return NOTE


def _bf16_as_fp32(create_dot, interpreter: Any):
    def create_dot_bf16_as_fp32(self, a, b, d, *args, **kwargs):
        return create_dot(self, _widened(a, interpreter), _widened(b, interpreter), d, *args, **kwargs)

    setattr(create_dot_bf16_as_fp32, _MARK, True)
    return create_dot_bf16_as_fp32


def _widened(handle: Any, interpreter: Any) -> Any:
    """A bfloat16 operand's values in fp32 (its data holds the bit patterns); any other operand as it is."""
    language = importlib.import_module("triton.language")
    if handle.dtype != language.bfloat16:
        return handle
    bits = handle.data.astype("uint32") << 16  # bfloat16 is fp32's upper half: widening is exact, inf and NaN kept
    return interpreter.TensorHandle(bits.view("float32"), language.float32)


def _elementwise(method, interpreter: Any, arithmetic):
    """`method` over fp32 values where an operand is bfloat16, its result rounded back when arithmetic(args)."""
    def bf16_as_fp32(self, *args):
        if not any(_is_bf16(a, interpreter) for a in args):
            return method(self, *args)
        out = method(self, *(_widened(a, interpreter) if _is_bf16(a, interpreter) else a for a in args))
        return _narrowed(out, interpreter) if arithmetic(args) else out

    return bf16_as_fp32


def _always(args: tuple) -> bool:
    return True


def _binary_arithmetic(args: tuple) -> bool:
    op = args[-1]
    return getattr(op, "__name__", "") in _ARITHMETIC


def _is_bf16(arg: Any, interpreter: Any) -> bool:
    language = importlib.import_module("triton.language")
    return isinstance(arg, interpreter.TensorHandle) and arg.dtype == language.bfloat16


def _narrowed(handle: Any, interpreter: Any) -> Any:
    """An fp32 result as bfloat16 bit patterns, rounded to nearest even (NaN stays a quiet NaN)."""
    language = importlib.import_module("triton.language")
    values = np.asarray(handle.data, dtype=np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded = np.where(np.isnan(values), ((bits >> 16) | 0x40).astype(np.uint16), rounded)
    return interpreter.TensorHandle(rounded, language.bfloat16)
