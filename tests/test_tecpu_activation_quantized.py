"""tex activations quantizing their output (te_verify/te/tecpu/activation_output.py), held to TE's definition: the
kernel computes the activation (or its gradient) in fp32 and rounds it to the output dtype; the quantized output is
what quantizing those rounded values gives, bitwise (every data, scale and amax buffer), where
- MXFP8, FP8 block scaling, row-scaled NVFP4 and NVFP4 with the RHT take every scale from the rounded values;
- current scaling and NVFP4 (plain, 2D, 4over6, stochastic rounding) take the per-tensor amax from the fp32 values
  (the activation kernel's amax) and the block scales from the rounded ones;
- delayed scaling casts the fp32 values (unchanged: test_tecpu_activation.py).
The fp32 values are the emulation's unquantized activation of the input upcast (held to fp64 definitions in
test_tecpu_activation.py), the quantization the emulation's tex.quantize (held to hand-computed vectors in
test_tecpu_block_quantize.py and the NVFP4 tests). Every case is one where the two amaxes differ, so taking the amax
from the rounded values cannot pass. Planted faults (quantizing the fp32 values, the amax of the rounded values)
fail the same check naming the buffer; gated MXFP8 below sm100 raises TE's error (sm100: test_te_mlp_block_recipes).
"""
from __future__ import annotations

import types
from typing import Any, Callable

import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import activation_output, quantize
from te_verify.te.tecpu.block_scales import tensor_amax

BUFFERS = ("_data", "_transpose", "_scale_inv", "_rowwise_data", "_rowwise_scale_inv", "_columnwise_data",
           "_columnwise_scale_inv", "_amax_rowwise", "_amax_columnwise")
# kind -> (quantizer class, constructor arguments); usages both, as LayerNormMLP's fc2 input.
NVFP4_OPTIONS = {"nvfp4": {}, "nvfp4_2d": {"with_2d_quantization": True},
                 "nvfp4_sr": {"stochastic_rounding": True},
                 "nvfp4_4over6": {"nvfp4_use_4over6": True, "nvfp4_e4m3_max": 256},
                 "nvfp4_row_scaled": {"row_scaled_nvfp4": True},
                 "nvfp4_rht": {"with_rht": True, "with_post_rht_amax": True}}
AMAX_FROM_FP32 = ("current", "nvfp4", "nvfp4_2d", "nvfp4_sr", "nvfp4_4over6")
KINDS = ["mxfp8", "block1d", "block2d", "current", *NVFP4_OPTIONS]


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor import float8_blockwise_tensor, float8_tensor, mxfp8_tensor, nvfp4_tensor

    e4m3 = tex.DType.kFloat8E4M3
    makers = {"mxfp8": lambda: mxfp8_tensor.MXFP8Quantizer(e4m3, rowwise=True, columnwise=True),
              "block1d": lambda: float8_blockwise_tensor.Float8BlockQuantizer(
                  e4m3, rowwise=True, columnwise=True, block_scaling_dim=1),
              "block2d": lambda: float8_blockwise_tensor.Float8BlockQuantizer(
                  e4m3, rowwise=True, columnwise=True, block_scaling_dim=2),
              "current": lambda: float8_tensor.Float8CurrentScalingQuantizer(e4m3, torch.device("cpu"), rowwise=True,
                                                                             columnwise=True)}
    makers.update({k: (lambda o=o: nvfp4_tensor.NVFP4Quantizer(rowwise=True, columnwise=True, **o))
                   for k, o in NVFP4_OPTIONS.items()})
    return types.SimpleNamespace(tex=tex, make=makers)


def operand(seed: int, width: int = 128) -> torch.Tensor:
    """A seeded bf16 (64, width) input over about [-3, 3] (gelu(x) is x itself in fp32 from x ~ 5 on)."""
    return (torch.randn(64, width, generator=torch.Generator().manual_seed(seed)) * 0.75).to(torch.bfloat16)


def buffers(t: Any) -> dict[str, torch.Tensor]:
    return {n: getattr(t, n) for n in BUFFERS if isinstance(getattr(t, n, None), torch.Tensor)}


def assert_same_bytes(got: Any, want: Any, what: str) -> None:
    g, w = buffers(got), buffers(want)
    assert sorted(g) == sorted(w) and g, f"{what}: buffers {sorted(g)} vs {sorted(w)}"
    counts = {n: (int((g[n].view(torch.uint8) != w[n].view(torch.uint8)).sum()), g[n].view(torch.uint8).numel())
              for n in g}
    bad = [f"{n} differs in {k} of {total} bytes" for n, (k, total) in counts.items() if k]
    assert not bad, f"{what}: {'; '.join(bad)}"


def expected(kind: str, values: torch.Tensor, quantizer: Any) -> Any:
    """The definition: the fp32 values rounded to bf16, quantized (under the fp32 values' amax where TE's kernel
    hands its amax to quantize_with_amax)."""
    rounded = values.to(torch.bfloat16)
    amax32, amax16 = tensor_amax(values), tensor_amax(rounded)
    assert amax32 != amax16, f"{kind}: the case cannot tell the two amaxes apart ({float(amax32)})"
    torch.manual_seed(7)  # stochastic rounding: the same draws as the call under test
    if kind in AMAX_FROM_FP32:
        return quantize.quantize_with_amax(rounded, quantizer, amax32)
    return quantize.quantize(rounded, quantizer)


CALLS: dict[str, Callable] = {  # name -> (tex, x, dy, quantizer) -> (output under test, its fp32 values)
    "gelu": lambda tex, x, dy, q: (tex.gelu(x, q), tex.gelu(x.float(), None)),
    "srelu": lambda tex, x, dy, q: (tex.srelu(x, q), tex.srelu(x.float(), None)),
    "swiglu": lambda tex, x, dy, q: (tex.swiglu(x, q), tex.swiglu(x.float(), None)),
    "dgelu": lambda tex, x, dy, q: (tex.dgelu(dy, x, q), tex.dgelu(dy.float(), x.float(), None)),
    "dgeglu": lambda tex, x, dy, q: (tex.dgeglu(dy[:, :64], x, q), tex.dgeglu(dy[:, :64].float(), x.float(), None)),
    "dbias_dsrelu": lambda tex, x, dy, q: (tex.dbias_dsrelu(dy, x, q)[1], tex.dsrelu(dy.float(), x.float(), None)),
    # limit 1.5: both clamps act on the operand.
    "clamped_swiglu": lambda tex, x, dy, q: (tex.clamped_swiglu(x, q, 1.5), tex.clamped_swiglu(x.float(), None, 1.5)),
    "clamped_dswiglu": lambda tex, x, dy, q: (tex.clamped_dswiglu(dy[:, :64], x, q, 1.5),
                                              tex.clamped_dswiglu(dy[:, :64].float(), x.float(), None, 1.5)),
}


def check(te: types.SimpleNamespace, kind: str, name: str) -> None:
    """One activation call with the `kind` quantizer against the definition (module docstring)."""
    x, dy = operand(3), operand(4)
    if name in ("swiglu", "dgeglu", "clamped_swiglu", "clamped_dswiglu") and kind == "mxfp8":
        pytest.skip("gated MXFP8 needs sm100 (test_te_mlp_block_recipes runs swiglu there, TE's own test_sanity and "
                    "test_fusible_ops clamped_swiglu)")
    torch.manual_seed(7)
    got, values = CALLS[name](te.tex, x, dy, te.make[kind]())
    assert_same_bytes(got, expected(kind, values, te.make[kind]()), f"{name} -> {kind}")


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("kind", KINDS)
def test_quantized_activation_is_the_rounded_values_quantized(te, kind: str, name: str) -> None:
    check(te, kind, name)


def _quantize_fp32(values: torch.Tensor, quantizer: Any, dtype: torch.dtype) -> Any:
    """Planted: quantizing the fp32 values, skipping the rounding to the output dtype."""
    if activation_output.kind_of(quantizer) in (None, "Float8Quantizer"):
        return PLANTED_ORIGINAL(values, quantizer, dtype)
    return quantize.quantize(values, quantizer)


def _amax_of_rounded(values: torch.Tensor, quantizer: Any, dtype: torch.dtype) -> Any:
    """Planted: the amax taken from the rounded values (as a plain quantize would)."""
    if activation_output.kind_of(quantizer) in (None, "Float8Quantizer"):
        return PLANTED_ORIGINAL(values, quantizer, dtype)
    return quantize.quantize(values.to(dtype), quantizer)


PLANTED_ORIGINAL = activation_output.write


@pytest.mark.parametrize("fault, kind, culprit", [
    (_quantize_fp32, "mxfp8", "_rowwise_data differs"), (_quantize_fp32, "block1d", "_rowwise_data differs"),
    (_quantize_fp32, "nvfp4", "_rowwise_data differs"),
    (_amax_of_rounded, "nvfp4", "_amax_rowwise differs"), (_amax_of_rounded, "current", "_scale_inv differs")])
def test_planted_fault_fails_naming_the_buffer(te, monkeypatch, fault: Callable, kind: str, culprit: str) -> None:
    monkeypatch.setattr(activation_output, "write", fault)
    with pytest.raises(AssertionError, match=culprit):
        check(te, kind, "gelu")


def test_gated_mxfp8_below_sm100_and_other_quantizers_raise(te) -> None:
    with pytest.raises(RuntimeError, match="Gated FWD NVTE_MXFP8_1D_SCALING is only supported on SM 10.0"):
        te.tex.swiglu(operand(3), te.make["mxfp8"]())
    with pytest.raises(tecpu.Unemulated, match="activation quantizing its output with object"):
        te.tex.gelu(operand(3), object())
