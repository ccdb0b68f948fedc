"""Kernels write into tensors TE's Python made under `torch.inference_mode()` (te_verify/te/tecpu/writes.py).

An inference pass allocates a delayed-scaling quantizer's amax and scale, the recipe's amax history and the cached
quantized weight as inference tensors; the next training step's kernels write them, as TE's C++ does through data
pointers (test_fusible_ops.py's TestTrainingLoops, infer then train). Each write is held to its definition:
- tex.quantize (delayed scaling) into inference state: amax = max(amax before, max |x|), data the E4M3 cast of x
  under the state's scale, bitwise as with ordinary tensors;
- fused_amax_and_scale_update_after_reduction on an inference history and scale: the history rolled, scale =
  448 / amax;
- MXFP8 and NVFP4 quantization into an output made under inference mode (the cached weight), and a GEMM into an
  inference D: bitwise as into ordinary tensors;
- TE's te.ops.Linear under FP8 delayed scaling, an inference pass, then a training step: output and gradients
  within FP8's error of torch."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import fp8, tecpu


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor import float8_tensor, mxfp8_tensor, nvfp4_tensor

    return types.SimpleNamespace(te=te_pytorch, tex=tex, delayed=float8_tensor.Float8Quantizer,
                                 mxfp8=mxfp8_tensor.MXFP8Quantizer, nvfp4=nvfp4_tensor.NVFP4Quantizer)


def inference(make):
    """What `make()` returns, allocated under torch.inference_mode() (every tensor an inference tensor)."""
    with torch.inference_mode():
        made = make()
    return made


def operand(seed: int, shape: tuple[int, ...] = (32, 64)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3


def test_delayed_quantize_writes_inference_amax(te) -> None:
    x = operand(1)
    scale = inference(lambda: torch.tensor([2.0]))
    amax = inference(lambda: torch.tensor([1.0]))
    assert scale.is_inference() and amax.is_inference()
    q = te.delayed(scale, amax, te.tex.DType.kFloat8E4M3)
    out = te.tex.quantize(x, q)
    want_amax = max(1.0, float(x.abs().max()))
    assert amax.tolist() == [want_amax], f"amax {amax.tolist()}, want max(1, max |x|) = {want_amax}"
    want = fp8.quantize(x, torch.tensor(2.0), torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(out._data, want), "inference-state quantize: data differs from the E4M3 cast under scale 2"


def test_delayed_scaling_update_writes_inference_history(te) -> None:
    history = inference(lambda: torch.tensor([[0.0], [2.0]]))
    scale = inference(lambda: torch.ones(1))
    reduced = torch.tensor([4.0])
    te.tex.fused_amax_and_scale_update_after_reduction(reduced, [history], [scale], "max",
                                                       te.tex.DType.kFloat8E4M3, 0)
    assert history.flatten().tolist() == [0.0, 4.0], f"history {history.flatten().tolist()}, want rolled [0, 4]"
    assert scale.tolist() == [112.0], f"scale {scale.tolist()}, want 448 / max(2, 4) = 112"


BLOCK_QUANTIZERS = {
    "mxfp8": lambda te: te.mxfp8(te.tex.DType.kFloat8E4M3, rowwise=True, columnwise=True),
    "nvfp4": lambda te: te.nvfp4(rowwise=True, columnwise=True),
}


def _buffers(t) -> list[torch.Tensor]:
    names = ("_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv", "_amax_rowwise",
             "_amax_columnwise")
    return [getattr(t, n) for n in names if getattr(t, n, None) is not None]


@pytest.mark.parametrize("kind", list(BLOCK_QUANTIZERS))
def test_block_quantize_into_an_inference_output(te, kind: str) -> None:
    x = operand(2).bfloat16()
    q = BLOCK_QUANTIZERS[kind](te)
    cached = inference(lambda: q.make_empty((32, 64), dtype=torch.bfloat16, device=torch.device("cpu")))
    assert all(b.is_inference() for b in _buffers(cached)), f"{kind}: the cached output is not an inference tensor"
    te.tex.quantize(x, q, cached)
    fresh = te.tex.quantize(x, BLOCK_QUANTIZERS[kind](te))
    pairs = list(zip(_buffers(cached), _buffers(fresh)))
    assert len(pairs) >= 4, f"{kind}: {len(pairs)} buffers compared"
    for i, (got, want) in enumerate(pairs):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), \
            f"{kind}: buffer {i} of the inference output differs from a fresh quantize"


def test_gemm_into_an_inference_output(te) -> None:
    a, b = operand(3, (16, 64)), operand(4, (32, 64))
    d = inference(lambda: torch.empty(32, 16))
    workspace = torch.empty(0, dtype=torch.uint8)
    te.tex.generic_gemm(a, True, b, False, d, None, te.tex.DType.kFloat32, None, te.tex.DType.kFloat32, False,
                        None, False, workspace, 0, False, False)
    torch.testing.assert_close(d, b @ a.t(), rtol=1e-5, atol=1e-5, msg=lambda m: f"GEMM into inference D: {m}")


def test_te_ops_linear_trains_after_an_inference_pass(te) -> None:
    """fp32, FP8 delayed scaling: the first forward (under inference mode) makes the recipe state; the training step
    after it updates that state and matches torch within E4M3's error."""
    from transformer_engine.common.recipe import DelayedScaling

    recipe = DelayedScaling()
    op = te.te.ops.Linear(64, 32, device="cpu", dtype=torch.float32)
    x = operand(5, (16, 64))
    with torch.inference_mode(), te.te.autocast(recipe=recipe):
        op(x)
    xt = x.clone().requires_grad_()
    with te.te.autocast(recipe=recipe):
        y = op(xt)
    y.sum().backward()
    w = op.weight.detach().clone().requires_grad_()
    xe = x.clone().requires_grad_()
    want = torch.nn.functional.linear(xe, w, op.bias.detach())
    want.sum().backward()
    for name, got, ref in (("output", y, want), ("input grad", xt.grad, xe.grad), ("weight grad", op.weight.grad, w.grad)):
        rel = float((got.detach() - ref.detach()).norm() / ref.norm())
        assert rel < 0.1, f"te.ops.Linear after an inference pass: {name} normwise error {rel:.3g} (E4M3: < 0.1)"
