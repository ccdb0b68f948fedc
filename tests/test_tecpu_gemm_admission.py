"""What TE's cublas_gemm and cuBLAS refuse before an FP8 GEMM runs (te_verify/te/tecpu/gemm_admission.py), each
refusal beside its twin that runs: Hopper's blockwise FP8 kernel takes no fast accumulation, no 2D x 2D, no epilogue
but DEFAULT, BIAS and DGELU, no E5M2 x E5M2, no DGELU auxiliary of another type than the output, and operands with k a
multiple of 16 and m (and n for a 1D-scaled B) of 8; and a GELU epilogue acts on alpha * AB + beta * C."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import block_fp8_gemm
from te_verify.te.tecpu.activation import FORMULAS


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()  # the default emulated sm90: cuBLAS's blockwise kernel
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer

    return types.SimpleNamespace(tex=tex, Block=Float8BlockQuantizer, Float8=Float8Quantizer)


def block(te, shape: tuple[int, int], dim: int, e5m2: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    fmt = te.tex.DType.kFloat8E5M2 if e5m2 else te.tex.DType.kFloat8E4M3
    return te.Block(fmt, rowwise=True, columnwise=True, block_scaling_dim=dim)(torch.randn(shape, generator=g))


def gemm(te, A, B, *, out=torch.bfloat16, D=None, bias=None, gelu=False, gelu_in=None, grad=False,
         accumulate=False, split=True):
    """tex.generic_gemm in TE's fprop layout (TN: A = weight (N, K), B = input (M, K))."""
    dtype = {torch.bfloat16: te.tex.DType.kBFloat16, torch.float32: te.tex.DType.kFloat32}[out]
    empty = torch.empty(0, dtype=torch.uint8)
    return te.tex.generic_gemm(A, True, B, False, D, None, dtype, bias, te.tex.DType.kBFloat16, gelu, gelu_in, grad,
                               empty, 0, accumulate, split)


def case(te, name: str):
    """(kwargs of gemm(), A, B) for one refusal or its twin; M = N = 256, K = 128 unless the case is about them."""
    W1, W2 = block(te, (256, 128), 1, seed=1), block(te, (256, 128), 2, seed=1)
    X1, X2 = block(te, (256, 128), 1, seed=2), block(te, (256, 128), 2, seed=2)
    aux = lambda dtype: torch.randn(256, 256, generator=torch.Generator().manual_seed(3)).to(dtype)
    bias = torch.randn(256).to(torch.bfloat16)
    return {
        "fast-accumulation": ({"split": False}, W2, X1),
        "split-accumulator": ({}, W2, X1),
        "2Dx2D": ({}, W2, X2),
        "1Dx1D": ({}, W1, X1),
        "bgrad": ({"bias": bias, "grad": True}, W2, X1),
        "bias": ({"bias": bias}, W2, X1),
        "gelu-aux": ({"gelu": True}, W2, X1),
        "dgelu-fp32-output": ({"gelu": True, "grad": True, "gelu_in": aux(torch.float32), "out": torch.float32}, W2, X1),
        "dgelu-bf16-output": ({"gelu": True, "grad": True, "gelu_in": aux(torch.bfloat16)}, W2, X1),
        "e5m2-by-e5m2": ({}, block(te, (256, 128), 2, e5m2=True), block(te, (256, 128), 1, e5m2=True)),
        "e5m2-by-e4m3": ({}, block(te, (256, 128), 2, e5m2=True), X1),
        "k-120": ({}, block(te, (256, 120), 2), block(te, (256, 120), 1)),
        "n-252": ({}, block(te, (252, 128), 2), X1),
        "m-255-1d-input": ({}, W2, block(te, (255, 128), 1)),
        "m-255-2d-input": ({}, W1, block(te, (255, 128), 2)),
    }[name]


REFUSED = {
    "fast-accumulation": "CUBLAS_STATUS_NOT_SUPPORTED",
    "2Dx2D": "Only 1D by 1D, 1D by 2D, and 2D by 1D block scaling GEMM is supported",
    "bgrad": "Epilogue requested outside of the available and tested cuBLAS functionality .*BGRADB",
    "gelu-aux": "Epilogue requested outside .*GELU_AUX",
    "dgelu-fp32-output": "an unsupported value or parameter was passed",
    "e5m2-by-e5m2": "CUBLAS_STATUS_NOT_SUPPORTED",
    "k-120": "Leading dimension requirement on NVTE_BLOCK_SCALING GEMM",
    "n-252": "Outer dimension requirement on A for NVTE_BLOCK_SCALING GEMM",
    "m-255-1d-input": "Outer dimension requirement on B for NVTE_BLOCK_SCALING GEMM",
}
RUNS = ["split-accumulator", "1Dx1D", "bias", "dgelu-bf16-output", "e5m2-by-e4m3", "m-255-2d-input"]


@pytest.mark.parametrize("name", REFUSED)
def test_refused_as_te_and_cublas_refuse_it(te, name: str) -> None:
    kwargs, A, B = case(te, name)
    with pytest.raises(RuntimeError, match=REFUSED[name]):
        gemm(te, A, B, **kwargs)


@pytest.mark.parametrize("name", RUNS)
def test_its_twin_runs(te, name: str) -> None:
    kwargs, A, B = case(te, name)
    out = gemm(te, A, B, **kwargs)[0]
    assert out.shape == (B.shape[0], A.shape[0]) and bool(torch.isfinite(out).all()), f"{name}: no finite output"


def test_per_tensor_e5m2_by_e5m2_is_refused_too(te) -> None:
    """cuBLAS's FP8 type table has no E5M2 x E5M2 for any scaling (PyTorch's _scaled_mm refuses it as well)."""
    make = lambda fmt, seed: te.Float8(torch.ones(1), torch.zeros(1), fmt)(
        torch.randn(32, 32, generator=torch.Generator().manual_seed(seed)))
    e5m2, e4m3 = te.tex.DType.kFloat8E5M2, te.tex.DType.kFloat8E4M3
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_NOT_SUPPORTED"):
        gemm(te, make(e5m2, 1), make(e5m2, 2), out=torch.float32)
    assert gemm(te, make(e4m3, 1), make(e5m2, 2), out=torch.float32)[0].shape == (32, 32)


def c_after_dgelu(product, c, gelu_prime) -> torch.Tensor:
    """Planted: C added after the epilogue (the emulation before gemm_admission's change)."""
    return (product.to(torch.bfloat16).float() * gelu_prime).to(torch.bfloat16) + c


def dgelu_of_sum(product, c, gelu_prime) -> torch.Tensor:
    """cuBLAS's DGELU over an accumulated output: (round(AB) + C) * gelu'(aux), as TE's blockwise test holds it
    (dgelu of its accumulated reference), the sum in fp32 (the test's 1e-3 cannot tell whether it is rounded first)."""
    return ((product.to(torch.bfloat16).float() + c.float()) * gelu_prime).to(torch.bfloat16)


@pytest.mark.parametrize("definition", [dgelu_of_sum, pytest.param(c_after_dgelu, marks=pytest.mark.xfail(strict=True))],
                         ids=["dgelu-of-sum", "planted-c-after-dgelu"])
def test_dgelu_acts_on_the_accumulated_sum(te, definition) -> None:
    kwargs, A, B = case(te, "dgelu-bf16-output")
    c = torch.randn(256, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    d = c.clone()
    gemm(te, A, B, D=d, accumulate=True, **kwargs)
    gelu_prime = FORMULAS["gelu"][1](kwargs["gelu_in"].float())
    want = definition(block_fp8_gemm.product(A, True, B, False), c, gelu_prime)
    bad = (d != want).nonzero().tolist()
    assert bad == [], f"{len(bad)} of {d.numel()} differ; first {bad[0]}: {d[tuple(bad[0])]} vs {want[tuple(bad[0])]}"
