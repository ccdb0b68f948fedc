"""Compatibility step for triton's interpreter under real_triton's "interpret" mode (measured on triton 3.9.0).

The interpreter stores bfloat16 as uint16 (numpy has no bfloat16) and its `tl.dot` converts only 8-bit float
operands before `np.matmul`: a bfloat16 dot multiplies the raw bit patterns (values near 1e10;
https://github.com/triton-lang/triton/issues/11584; the fix, PR 11585, was closed: "we just don't support it yet").
TE's mHC kernels take bfloat16 dots, so every bfloat16 mHC item of TE's tests failed by ~1e10 on it. The step converts
bfloat16 dot operands to fp32 first (exact; a GPU's dot accumulates their products in fp32), only on the triton
versions it was measured on (MEASURED), and is named in the header. Not covered: the interpreter's other bfloat16
arithmetic (elementwise ops, reductions) also computes on the bit patterns (PR 10945, closed); kernels that use it
fail under the interpreter, which docs/te-lane.md sorts as the interpreter's.
"""
from __future__ import annotations

import importlib
from typing import Any

from packaging.specifiers import SpecifierSet

MEASURED = SpecifierSet(">=3.9,<3.10")
NOTE = "bfloat16 tl.dot operands converted to fp32 in the interpreter (triton-lang/triton#11584)"
_MARK = "_te_verify_bf16_dot"


def apply(triton_version: str) -> str | None:
    """Wrap the interpreter's create_dot on the measured versions (once); returns the header's note, or None."""
    if triton_version not in MEASURED:
        return None
    interpreter = importlib.import_module("triton.runtime.interpreter")
    builder = interpreter.InterpreterBuilder
    if not getattr(builder.create_dot, _MARK, False):
        builder.create_dot = _bf16_as_fp32(builder.create_dot, interpreter)
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
