"""tex.dropout_fwd / dropout_bwd (te_verify/te/tecpu/dropout.py) held to dropout.cu's definition, written here:
- the mask: numel / 8 bytes, byte b bit k the element 8 b + k, 1 = kept; every dropped output 0 and every kept one
  fp32(x) * fp32(1 / (1 - p)) cast to the dtype, bitwise (FP16 and BF16; a tensor-scaled FP8 input dequantized by its
  scale_inv first, in its nominal dtype);
- the drop rate is floor(256 p) / 256, not p: at p = 0.3 over 2^20 elements the observed rate lies within 4 sigma
  of 76 / 256 and beyond 4 sigma of 0.3;
- dropout_bwd sends the gradient through the same mask and scale, bitwise;
- dropout.cu's checks (FP16/BF16 only, numel a multiple of 16, p in [0, 1)); TE's te.ops Dropout over it keeps its
  forward and backward on one mask."""
from __future__ import annotations

import math
import types

import pytest
import torch

from te_verify.te import tecpu

HALF = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor import float8_tensor

    return types.SimpleNamespace(te=te_pytorch, tex=tex, delayed=float8_tensor.Float8Quantizer)


def kept_of(mask: torch.Tensor, numel: int) -> torch.Tensor:
    """The definition's mask read: element i kept iff bit i % 8 of byte i // 8 is set."""
    assert mask.dtype == torch.uint8 and mask.shape == (numel // 8,), f"mask {mask.dtype} {list(mask.shape)}"
    i = torch.arange(numel)
    return ((mask.to(torch.int64)[i // 8] >> (i % 8)) & 1).bool()


def scale_of(p: float) -> torch.Tensor:
    return torch.tensor(1.0) / (torch.tensor(1.0) - torch.tensor(p, dtype=torch.float32))


def expected(values: torch.Tensor, kept: torch.Tensor, p: float, dtype: torch.dtype) -> torch.Tensor:
    want = torch.zeros(values.numel(), dtype=dtype)
    want[kept] = (values.float().reshape(-1)[kept] * scale_of(p)).to(dtype)
    return want.reshape(values.shape)


@pytest.mark.parametrize("p", [0.0625, 0.5, 0.75])
@pytest.mark.parametrize("dtype", HALF)
def test_forward_and_backward_are_the_definition(te, dtype: torch.dtype, p: float) -> None:
    x = (torch.randn(8, 256, generator=torch.Generator().manual_seed(1)) + 1).to(dtype)
    out, mask = te.tex.dropout_fwd(x, p)
    kept = kept_of(mask, x.numel())
    assert out.dtype == dtype and out.shape == x.shape, f"dropout_fwd out {out.dtype} {list(out.shape)}"
    assert 0 < int(kept.sum()) < x.numel(), f"p={p}: {int(kept.sum())} of {x.numel()} kept"
    assert torch.equal(out, expected(x, kept, p, dtype)), f"dropout_fwd p={p}: output is not x * scale on the mask"
    dy = torch.randn(8, 256, generator=torch.Generator().manual_seed(2)).to(dtype)
    dx = te.tex.dropout_bwd(dy, mask, p)
    assert torch.equal(dx, expected(dy, kept, p, dtype)), f"dropout_bwd p={p}: gradient is not dy * scale on the mask"


def test_fp8_input_is_dequantized_first(te) -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3)) + 1
    q = te.delayed(torch.tensor([4.0]), torch.zeros(1), te.tex.DType.kFloat8E4M3)
    xq = q(x.bfloat16())
    out, mask = te.tex.dropout_fwd(xq, 0.5)
    values = xq._data.view(torch.float8_e4m3fn).float() * xq._scale_inv.float()
    assert out.dtype == torch.bfloat16, f"dropout_fwd of FP8 gave {out.dtype}, want the nominal bf16"
    assert torch.equal(out, expected(values, kept_of(mask, x.numel()), 0.5, torch.bfloat16)), \
        "dropout_fwd of FP8: output is not (fp8 * scale_inv) * scale on the mask"


def test_drop_rate_is_the_byte_quantized_probability(te) -> None:
    n, p = 1 << 20, 0.3
    _, mask = te.tex.dropout_fwd(torch.ones(n, dtype=torch.bfloat16), p)
    rate = 1 - float(kept_of(mask, n).float().mean())
    quantized = math.floor(256 * p) / 256
    sigma = math.sqrt(quantized * (1 - quantized) / n)
    assert abs(rate - quantized) < 4 * sigma, f"drop rate {rate:.5f}, want floor(256 p) / 256 = {quantized:.5f}"
    assert abs(rate - p) > 4 * sigma, f"drop rate {rate:.5f} is p itself, not its byte quantization"


def test_dropout_cu_checks(te) -> None:
    with pytest.raises(RuntimeError, match="FP16/BF16"):
        te.tex.dropout_fwd(torch.ones(32), 0.5)
    with pytest.raises(RuntimeError, match="divisible by 16"):
        te.tex.dropout_fwd(torch.ones(24, dtype=torch.bfloat16), 0.5)
    with pytest.raises(RuntimeError, match="Invalid dropout probability"):
        te.tex.dropout_fwd(torch.ones(32, dtype=torch.bfloat16), 1.0)
    with pytest.raises(RuntimeError, match="bits"):
        te.tex.dropout_bwd(torch.ones(32, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.uint8), 0.5)


def test_te_ops_dropout_uses_one_mask(te) -> None:
    """te.ops Dropout (training, bf16): y is x / (1 - p) where y is non-zero, and the gradient flows there only."""
    x = (torch.rand(16, 64, generator=torch.Generator().manual_seed(4)) + 1).bfloat16().requires_grad_()
    op = te.te.ops.Dropout(0.5)
    op.train()
    y = op(x)
    y.backward(torch.ones_like(y))
    kept = y != 0
    assert 0 < int(kept.sum()) < y.numel(), f"{int(kept.sum())} of {y.numel()} kept"
    assert torch.equal(y[kept], (x.detach()[kept].float() * 2).bfloat16()), "kept outputs are not x / (1 - p)"
    assert torch.equal(x.grad, torch.where(kept, 2.0, 0.0).bfloat16()), "the gradient's mask is not the output's"
