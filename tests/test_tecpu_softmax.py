"""The fused softmax kernels of TE's unfused attention (te_verify/te/tecpu/attention.py) held to the definitions of
common/fused_softmax/*.cu, written here in float64:
- forward: softmax over the keys of the scores times the scale rounded to the input dtype; masked positions -10000
  (padding/arbitrary mask where it is 1, aligned causal past the bottom-right diagonal) or -inf (upper triangular);
  a row with every position masked is 0; each output within one unit in the last place of the fp64 value (the
  kernels compute in fp32 and round once);
- backward: scale (g y - y sum(g y)) from the saved probabilities, scale in fp32, within one unit in the last place;
- softmax.cpp's checks; tex.get_fused_attn_backend answers "no backend", so TE's DotProductAttention in BF16 runs its
  unfused path through these kernels and agrees with TE's own torch softmax path (NVTE_MASKED_SOFTMAX_FUSION=0)."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu

HALF = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
SCALE = 0.3  # not representable in BF16 or FP16: the forward's rounding of it shows


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex

    return types.SimpleNamespace(te=te_pytorch, tex=tex)


def scores(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 4).to(dtype)


def definition(x: torch.Tensor, masked: torch.Tensor | None, fill: float, scale: float) -> torch.Tensor:
    """fp64 softmax of x times scale (rounded to x's dtype), masked positions at `fill`; all-masked rows 0 and, with
    fill -inf, masked positions 0."""
    s = x.double() * torch.tensor(scale).to(x.dtype).double()
    if masked is None:
        return s.softmax(-1)
    s = s.masked_fill(masked, fill)
    probs = (s - s.amax(-1, keepdim=True)).exp()
    probs = probs / probs.sum(-1, keepdim=True)
    return probs.masked_fill(masked.all(-1, keepdim=True), 0.0)


def assert_within_one_ulp(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    finfo = torch.finfo(got.dtype)
    bound = finfo.eps * want.abs() + finfo.tiny * finfo.eps
    err = (got.double() - want).abs()
    worst = int(torch.argmax(err - bound))
    assert bool((err <= bound).all()), (f"{what}: element {worst} is {got.reshape(-1)[worst].item()}, the fp64 "
                                        f"definition {want.reshape(-1)[worst].item()} (more than one ulp apart)")


@pytest.mark.parametrize("dtype", HALF)
def test_scaled_softmax_is_the_definition_with_the_scale_in_the_input_dtype(te, dtype):
    x = scores((2, 3, 8, 64), dtype)
    got = te.tex.scaled_softmax_forward(x, SCALE)
    assert got.dtype == dtype and got.shape == x.shape
    assert_within_one_ulp(got, definition(x, None, 0.0, SCALE), "scaled_softmax_forward")
    unrounded = (x.double() * SCALE).softmax(-1)
    assert not torch.equal(got, unrounded.to(dtype)), "the scale was not rounded to the input dtype"


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("pad_batches", [1, 2])
def test_scaled_masked_softmax_masks_where_the_mask_is_one_and_zeroes_fully_masked_rows(te, dtype, pad_batches):
    x = scores((2, 3, 8, 32), dtype)
    mask = torch.rand(pad_batches, 1, 8, 32, generator=torch.Generator().manual_seed(1)) > 0.6
    mask[0, 0, 3] = True  # a fully masked row
    got = te.tex.scaled_masked_softmax_forward(x, mask.to(torch.uint8), SCALE)
    want = definition(x, mask.expand(x.shape), -10000.0, SCALE)
    assert_within_one_ulp(got, want, "scaled_masked_softmax_forward")
    assert bool((got[:, :, 3] == 0).all() if pad_batches == 1 else (got[0, :, 3] == 0).all()), "fully masked row"


@pytest.mark.parametrize("dtype", HALF)
def test_upper_triangular_softmax_keeps_keys_up_to_the_row(te, dtype):
    x = scores((6, 32, 32), dtype)
    got = te.tex.scaled_upper_triang_masked_softmax_forward(x, SCALE)
    above = torch.ones(32, 32, dtype=torch.bool).triu(1).expand(x.shape)
    assert bool((got[above] == 0).all()), "a position above the diagonal is not 0"
    assert_within_one_ulp(got, definition(x, above, float("-inf"), SCALE), "scaled_upper_triang_masked_softmax")


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("queries,keys", [(8, 32), (32, 32), (40, 32)], ids=["sk>sq", "square", "sq>sk"])
def test_aligned_causal_softmax_is_bottom_right_aligned(te, dtype, queries, keys):
    x = scores((2, 2, queries, keys), dtype)
    got = te.tex.scaled_aligned_causal_masked_softmax_forward(x, SCALE)
    past = torch.ones(queries, keys, dtype=torch.bool).triu(keys - queries + 1).expand(x.shape)
    assert bool((got[past] == 0).all()), "a position past the bottom-right diagonal is not 0"
    assert_within_one_ulp(got, definition(x, past, -10000.0, SCALE), "scaled_aligned_causal_masked_softmax")


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kernel,shape", [("scaled_softmax", (2, 3, 8, 32)), ("scaled_masked_softmax", (2, 3, 8, 32)),
                                          ("scaled_upper_triang_masked_softmax", (4, 16, 16)),
                                          ("scaled_aligned_causal_masked_softmax", (2, 2, 8, 32))])
def test_backward_is_the_softmax_jacobian_product_of_the_saved_probabilities(te, dtype, kernel, shape):
    y = scores(shape, torch.float32, seed=2).softmax(-1).to(dtype)
    g = scores(shape, dtype, seed=3)
    got = getattr(te.tex, f"{kernel}_backward")(g, y, SCALE)
    gy = g.double() * y.double()
    want = torch.tensor(SCALE, dtype=torch.float32).double() * (gy - y.double() * gy.sum(-1, keepdim=True))
    assert got.dtype == dtype
    assert_within_one_ulp(got, want, f"{kernel}_backward")


@pytest.mark.parametrize("call,message", [
    (lambda tex: tex.scaled_softmax_forward(torch.zeros(2, 2, 8, 32), 1.0), "Only fp16 and bf16"),
    (lambda tex: tex.scaled_softmax_forward(torch.zeros(2, 2, 8, 30, dtype=torch.bfloat16), 1.0), "divisible by 8"),
    (lambda tex: tex.scaled_softmax_forward(torch.zeros(2, 2, 1, 32, dtype=torch.bfloat16), 1.0), "greater than 1"),
    (lambda tex: tex.scaled_masked_softmax_forward(torch.zeros(2, 2, 8, 32, dtype=torch.bfloat16),
                                                   torch.zeros(3, 1, 8, 32, dtype=torch.uint8), 1.0), "[1 or 2, 1"),
    (lambda tex: tex.scaled_upper_triang_masked_softmax_forward(torch.zeros(2, 8, 8, 8, dtype=torch.float16), 1.0),
     "expected 3D"),
], ids=["fp32", "keys%8", "one-query", "mask-batches", "upper-4d"])
def test_softmax_cpp_checks(te, call, message):
    with pytest.raises(RuntimeError, match=message.replace("[", r"\[")):
        call(te.tex)


def test_no_fused_attention_backend_so_dot_product_attention_runs_its_unfused_path(te, monkeypatch):
    called = []
    for name in ("scaled_softmax_forward", "scaled_masked_softmax_forward"):
        kernel = getattr(te.tex, name)
        monkeypatch.setattr(te.tex, name, lambda *a, kernel=kernel, name=name: (called.append(name), kernel(*a))[1])
    outputs = {}
    for fusion in ("1", "0"):
        monkeypatch.setenv("NVTE_MASKED_SOFTMAX_FUSION", fusion)
        torch.manual_seed(0)
        attention = te.te.DotProductAttention(4, 32, attn_mask_type="causal", attention_dropout=0.0)
        q, k, v = (torch.randn(32, 4, 4, 32, dtype=torch.bfloat16) for _ in range(3))
        outputs[fusion] = attention(q, k, v).float()
    assert called == ["scaled_masked_softmax_forward"], called
    kernel, torch_path = outputs["1"], outputs["0"]
    bound = torch.finfo(torch.bfloat16).eps * torch_path.abs().amax()
    assert float((kernel - torch_path).abs().max()) <= bound, "the kernels' attention is not TE's torch softmax path's"
