"""Row-scaled NVFP4 (NVFP4BlockScaling(row_scaled_activation=True)) over the emulation, against the definition
computed here in numpy fp32 scalars (TE main's compute_rowwise_amax_kernel and quantize_transpose_nvfp4_tuned_1D.cuh
with ROW_SCALED_NVFP4; te_verify/te/tecpu/nvfp4.py's docstring states it): every row of the quantized matrix has its
own amax (max |x| over the row) and S_enc = 448 * 6 / amax_row, and its 1x16 blocks are cast as plain NVFP4 under it
(s_b = e4m3(block_amax * (S_enc * fp32(1/6))), q = e2m1(x * min(1 / (s_b * (1 / S_enc)), fp32 max))); the columnwise
copy (bf16, dims divisible by 32) does the same per column of x; dequantization is q * (s_b * amax_row *
fp32(1 / 2688)). TE's own errors where its kernels reject an option; a row-scaled operand reaching cuBLAS raises (TE's
Python runs the GEMM on aliases with amax 1 and scales the output by the row amaxes itself). Planted faults (one
amax for the whole tensor; the first row's amax for every row in dequantize) fail for their reason."""
from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import block_quantize, nvfp4
from te_verify.te.tecpu.block_scales import tensor_amax

F = np.float32
FLT_MAX = F(np.finfo(np.float32).max)
GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    return types.SimpleNamespace(tex=tex, NVFP4=NVFP4Quantizer, FP4=tex.DType.kFloat4E2M1)


def e2m1_code(v: np.float32) -> int:
    """Round to nearest on the E2M1 grid, ties to the even code, saturating at 6; sign in bit 3."""
    a = min(abs(float(v)), 6.0)
    code = min(range(8), key=lambda i: (abs(GRID[i] - a), i % 2))
    return code + 8 * int(math.copysign(1.0, float(v)) < 0)


def e4m3_byte(v: np.float32) -> int:
    """E4M3 (round to nearest even, saturating at 448) as its byte."""
    return int(torch.tensor(min(float(v), 448.0)).to(torch.float8_e4m3fn).view(torch.uint8))


def e4m3_value(byte: int) -> np.float32:
    return F(torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item())


def by_definition(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(E2M1 codes (M, K), scale bytes (M, K/16), amax per row (M,)) of a 2-D matrix, row-scaled."""
    xs = x.float().numpy().astype(F)
    m, k = xs.shape
    codes, scales = np.zeros((m, k), np.int64), np.zeros((m, k // 16), np.uint8)
    amax = np.abs(xs).max(axis=1).astype(F)
    with np.errstate(divide="ignore", over="ignore"):
        for r in range(m):
            s_enc = min(F(448 * 6) / amax[r], FLT_MAX)
            s_enc = F(1) if amax[r] == 0 or s_enc == 0 else s_enc
            for c0 in range(0, k, 16):
                block = xs[r, c0:c0 + 16]
                byte = e4m3_byte(F(np.abs(block).max()) * (s_enc * (F(1) / F(6))))
                inverse = min(F(1) / (e4m3_value(byte) * (F(1) / s_enc)), FLT_MAX)
                scales[r, c0 // 16] = byte
                codes[r, c0:c0 + 16] = [e2m1_code(v * inverse) for v in block]
    return codes, scales, amax


def unpack(data: torch.Tensor) -> np.ndarray:
    d = data.reshape(data.shape[0], -1)
    return torch.stack([d & 0xF, d >> 4], dim=-1).reshape(d.shape[0], -1).long().numpy()


def sample(rows: int, cols: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Rows whose amaxes span 10^-2 to 10^2, so one tensor amax would change every row's scales."""
    torch.manual_seed(seed)
    return (torch.randn(rows, cols) * torch.logspace(-2, 2, rows).reshape(-1, 1)).to(dtype)


def quantize(te, x: torch.Tensor, columnwise: bool, **kwargs):
    return te.NVFP4(fp4_dtype=te.FP4, rowwise=True, columnwise=columnwise, row_scaled_nvfp4=True, **kwargs)(x)


def quantize_failures(te, x: torch.Tensor, columnwise: bool) -> list[str]:
    qx = quantize(te, x, columnwise)
    copies = [("rowwise", x, qx._rowwise_data, qx._rowwise_scale_inv, qx._amax_rowwise)]
    if columnwise:
        copies.append(("columnwise", x.t(), qx._columnwise_data, qx._columnwise_scale_inv, qx._amax_columnwise))
    failures = []
    for name, src, data, buffer, amax in copies:
        codes, scales, amaxes = by_definition(src)
        wrong = (int((unpack(data) != codes).sum()), int((buffer[:scales.shape[0], :scales.shape[1]].numpy()
                                                          != scales).sum()), int((amax.numpy() != amaxes).sum()))
        if any(wrong):
            failures.append(f"{name}: {wrong[0]} of {codes.size} codes, {wrong[1]} of {scales.size} scales, "
                            f"{wrong[2]} of {amaxes.size} amaxes differ from the definition")
    assert qx._row_scaled_nvfp4
    return failures


def dequantize_failures(te, x: torch.Tensor) -> list[str]:
    qx = quantize(te, x, columnwise=False)
    codes, scales, amax = by_definition(x)
    factor_inv = F(1) / F(6 * 448)
    want = np.zeros(codes.shape, F)
    for r, c in np.ndindex(*codes.shape):
        q = F(-GRID[codes[r, c] & 7] if codes[r, c] & 8 else GRID[codes[r, c] & 7])
        want[r, c] = q * (e4m3_value(int(scales[r, c // 16])) * amax[r] * factor_inv)
    wrong = int((qx.dequantize(dtype=torch.float32).numpy() != want).sum())
    return [f"{wrong} of {want.size} dequantized values differ from the definition"] if wrong else []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rowwise_copy_matches_the_definition(te, dtype: torch.dtype) -> None:
    assert quantize_failures(te, sample(48, 64, seed=1, dtype=dtype), columnwise=False) == []


def test_both_copies_match_the_definition(te) -> None:
    """The columnwise copy: x^T cast with one amax per column of x (TE main: bf16, dims divisible by 32)."""
    assert quantize_failures(te, sample(64, 96, seed=2), columnwise=True) == []


def test_dequantize_reads_each_rows_amax(te) -> None:
    assert dequantize_failures(te, sample(48, 64, seed=3)) == []


def test_options_the_kernels_reject_raise_tes_errors(te) -> None:
    x = sample(64, 64, seed=4)
    cases = [({"with_2d_quantization": True}, False, x, "does not support 2D quantization"),
             ({"nvfp4_use_4over6": True}, True, x, "not supported with 4over6 mode"),
             ({}, True, x.float(), "requires BF16 input and dimensions that are multiples of 32"),
             ({}, True, x[:48], "requires BF16 input and dimensions that are multiples of 32")]
    for kwargs, columnwise, src, message in cases:
        with pytest.raises(RuntimeError, match=message):
            quantize(te, src, columnwise, **kwargs)
    with pytest.raises(RuntimeError, match="requires rowwise usage"):
        te.NVFP4(fp4_dtype=te.FP4, rowwise=False, columnwise=True, row_scaled_nvfp4=True)(x)


def test_a_row_scaled_operand_in_cublas_raises_as_te(te) -> None:
    """cublaslt_gemm.cu's first check, before anything else of the GEMM (TE's Python never passes one)."""
    qa, qb = quantize(te, sample(32, 64, seed=5), False), quantize(te, sample(32, 64, seed=6), False)
    with pytest.raises(RuntimeError, match="cuBLAS GEMM does not support row-scaled NVFP4 inputs"):
        te.tex.generic_gemm(qa, True, qb, False, None, None, te.tex.DType.kFloat32, None, te.tex.DType.kBFloat16,
                            False, None, False, torch.empty(1, dtype=torch.uint8), 1, False, False)


def per_tensor_amax(mp: pytest.MonkeyPatch) -> None:
    """Planted: the tensor's amax for every row."""
    mp.setattr(block_quantize, "_row_amax", lambda x: tensor_amax(x).reshape(1).expand(x.shape[0]).clone())


def first_row_amax(mp: pytest.MonkeyPatch) -> None:
    """Planted: dequantize scales every row by the first row's amax."""
    original = nvfp4.dequantize
    mp.setattr(nvfp4, "dequantize", lambda data, scales, amax, e4m3_max: original(data, scales, amax[:1], e4m3_max))


def test_planted_per_tensor_amax_is_caught(te, monkeypatch) -> None:
    per_tensor_amax(monkeypatch)
    assert quantize_failures(te, sample(64, 96, seed=2), columnwise=True) == [
        "rowwise: 375 of 6144 codes, 378 of 384 scales, 63 of 64 amaxes differ from the definition",
        "columnwise: 283 of 6144 codes, 380 of 384 scales, 95 of 96 amaxes differ from the definition"]


def test_planted_first_row_amax_in_dequantize_is_caught(te, monkeypatch) -> None:
    first_row_amax(monkeypatch)
    assert dequantize_failures(te, sample(48, 64, seed=3)) == [
        "2809 of 3072 dequantized values differ from the definition"]
