"""The compatibility step for triton's interpreter (te_verify/te/tecpu/triton_interpreter_compat.py), over a fake
interpreter whose dot and elementwise ops compute on what they are given, as triton 3.9.0's do with bfloat16's bit
patterns: bfloat16 operands reach them as their fp32 values and arithmetic comes back as bfloat16 rounded to nearest
even (bitwise torch's bfloat16 arithmetic), comparisons as truth values, other operands unchanged, once, and only on
the versions measured."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from te_verify.te.tecpu import triton_interpreter_compat as compat

BF16, FP16, FP32 = "bf16", "fp16", "fp32"  # the fake triton.language's dtypes


@pytest.fixture
def interpreter(monkeypatch) -> types.SimpleNamespace:
    """A fake triton.runtime.interpreter whose create_dot is np.matmul of the handles' data, as triton's."""
    class TensorHandle:
        def __init__(self, data, dtype):
            self.data, self.dtype = data, dtype

    class InterpreterBuilder:
        def create_dot(self, a, b, d, input_precision=None, max_num_imprecise_acc=None):
            return TensorHandle(np.matmul(a.data, b.data, dtype=np.float32) + d.data, FP32)

        def binary_op(self, lhs, rhs, op):
            return TensorHandle(op(lhs.data, rhs.data), lhs.dtype)

        def unary_op(self, arg, op):
            return TensorHandle(op(arg.data), arg.dtype)

        def create_fma(self, x, y, z):
            return TensorHandle(x.data * y.data + z.data, z.dtype)

    fake = types.SimpleNamespace(TensorHandle=TensorHandle, InterpreterBuilder=InterpreterBuilder)
    monkeypatch.setitem(sys.modules, "triton.runtime.interpreter", fake)
    monkeypatch.setitem(sys.modules, "triton.language", types.SimpleNamespace(bfloat16=BF16, float32=FP32))
    return fake


def bf16_handle(interpreter, values: torch.Tensor):
    """A bfloat16 block as the interpreter holds it: the bit patterns as uint16."""
    return interpreter.TensorHandle(values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), BF16)


def test_bfloat16_dot_multiplies_values_after_the_step(interpreter) -> None:
    a, b = torch.randn(16, 8), torch.randn(8, 16)
    want = (a.to(torch.bfloat16).float() @ b.to(torch.bfloat16).float()).numpy()
    zeros = interpreter.TensorHandle(np.zeros((16, 16), np.float32), FP32)
    builder = interpreter.InterpreterBuilder()
    before = builder.create_dot(bf16_handle(interpreter, a), bf16_handle(interpreter, b), zeros).data
    assert np.abs(before - want).max() > 1e6, "the fake does not show the bug: the test would prove nothing"
    assert compat.apply("3.9.0") == compat.NOTE
    after = interpreter.InterpreterBuilder().create_dot(bf16_handle(interpreter, a), bf16_handle(interpreter, b), zeros)
    np.testing.assert_allclose(after.data, want, rtol=1e-6, atol=1e-6)


def test_other_operands_pass_unchanged_and_the_step_wraps_once(interpreter) -> None:
    seen = []
    interpreter.InterpreterBuilder.create_dot = lambda self, a, b, d, *rest: seen.append((a, b))
    compat.apply("3.9.0")
    wrapped = interpreter.InterpreterBuilder.create_dot
    compat.apply("3.9.1")
    assert interpreter.InterpreterBuilder.create_dot is wrapped, "the step wrapped the interpreter's dot twice"
    a = interpreter.TensorHandle(np.ones((2, 2), np.float16), FP16)
    interpreter.InterpreterBuilder().create_dot(a, a, None)
    assert seen == [(a, a)], "an fp16 operand was changed"


@pytest.mark.parametrize("version", ["3.8.0", "3.10.0"])
def test_versions_outside_the_measured_range_are_left_alone(interpreter, version: str) -> None:
    original = interpreter.InterpreterBuilder.create_dot
    assert compat.apply(version) is None
    assert interpreter.InterpreterBuilder.create_dot is original


def bf16_values(handle) -> torch.Tensor:
    assert handle.dtype == BF16 and handle.data.dtype == np.uint16, "not a bfloat16 block as the interpreter holds it"
    return torch.from_numpy(handle.data.view(np.int16).copy()).view(torch.bfloat16)


@pytest.mark.parametrize("op, torch_op", [(np.multiply, torch.mul), (np.add, torch.add), (np.subtract, torch.sub),
                                          (np.divide, torch.div), (np.maximum, torch.maximum)],
                         ids=["mul", "add", "sub", "div", "max"])
def test_bfloat16_arithmetic_is_torchs_after_the_step(interpreter, op, torch_op) -> None:
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(4096, generator=g) * 3, torch.randn(4096, generator=g)
    a[:3], b[:3] = torch.tensor([float("nan"), 3.0e38, -0.0]), torch.tensor([1.0, 3.0e38, 0.0])  # NaN, overflow, -0
    want = torch_op(a.to(torch.bfloat16), b.to(torch.bfloat16))
    lhs, rhs = bf16_handle(interpreter, a), bf16_handle(interpreter, b)
    with np.errstate(all="ignore"):  # the bug itself: uint16 bit patterns overflow and divide by zero
        before = interpreter.InterpreterBuilder().binary_op(lhs, rhs, op)
    assert not np.array_equal(before.data.astype(np.float32), want.float().numpy()), "the fake shows no bug"
    compat.apply("3.9.0")
    with np.errstate(all="ignore"):  # 3e38 * 3e38 overflows to inf, as torch's does
        got = bf16_values(interpreter.InterpreterBuilder().binary_op(lhs, rhs, op))
    same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
    assert bool(same.all()), f"{int((~same).sum())} of {got.numel()} differ, first at {int((~same).nonzero()[0])}"


def test_bfloat16_comparisons_unary_ops_and_fma_after_the_step(interpreter) -> None:
    a, b = torch.randn(256), torch.randn(256)
    lhs, rhs = bf16_handle(interpreter, a), bf16_handle(interpreter, b)
    compat.apply("3.9.0")
    builder = interpreter.InterpreterBuilder()
    less = builder.binary_op(lhs, rhs, np.less)
    assert less.dtype == FP32 and np.array_equal(less.data, (a.to(torch.bfloat16) < b.to(torch.bfloat16)).numpy()), \
        "a comparison was rounded as a value or compared bit patterns"
    negated = bf16_values(builder.unary_op(lhs, np.negative))
    assert torch.equal(negated, -a.to(torch.bfloat16))
    fma = bf16_values(builder.create_fma(lhs, rhs, lhs))
    x, y = a.to(torch.bfloat16).float(), b.to(torch.bfloat16).float()
    assert torch.equal(fma, (x * y + x).to(torch.bfloat16)), "fma not computed on the values, rounded once to bf16"
    halves = interpreter.TensorHandle(np.ones(4, np.float16), FP16)
    assert builder.binary_op(halves, halves, np.add).data.dtype == np.float16, "an fp16 operand was changed"
