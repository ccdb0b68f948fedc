"""TE 2.20.2's LayerNormMLP forward + backward under MXFP8BlockScaling and NVFP4BlockScaling (TE's defaults: RHT,
stochastic rounding of gradients, 2D weights) at emulated sm100, its activation quantizing fc2's input through the
emulated tex activation (and dbias_d<act> quantizing fc1's gradient under MXFP8), against the same layer in fp32
torch (layer_norm, fc1, the activation, fc2; no quantization): the output and every gradient normwise,
||te - ref|| / ||ref||, within the format's rtol of TE's tests (tests/pytorch/utils.py quantization_tols: E4M3's
0.125 for MXFP8); for NVFP4 within twice E2M1's 0.25 (our bound: TE's tolerance is per quantized operand and these
values pass two NVFP4 GEMMs in series; measured at most 0.32). Per element TE's atol/rtol do not hold against an
unquantized reference (MXFP8: 67 of 8,192 outputs beyond them for gelu). Also the gated MXFP8 activations (sm100
only) bitwise against quantize of their bf16-rounded values.
Run as a script (`python tests/mlp_block_recipe_e2e.py`) it boots TE at sm100 and prints {run: failures} as JSON.
"""
from __future__ import annotations

import json
import math

import torch

HIDDEN, FFN, TOKENS = 128, 256, 64
NORMWISE = {"mxfp8": 0.125, "nvfp4": 2 * 0.25}
ACTIVATIONS = ("gelu", "srelu", "swiglu")


def _act(name: str, h: torch.Tensor) -> torch.Tensor:
    """TE's definitions (common/util/math.h): tanh GELU, squared ReLU, SwiGLU over [a | g]."""
    if name == "gelu":
        return torch.nn.functional.gelu(h, approximate="tanh")
    if name == "srelu":
        return torch.relu(h) ** 2
    a, g = h.chunk(2, -1)
    return torch.nn.functional.silu(a) * g


def _params(activation: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    width = 2 * FFN if activation == "swiglu" else FFN
    return {"ln_w": 1 + 0.1 * torch.randn(HIDDEN, generator=gen), "ln_b": 0.1 * torch.randn(HIDDEN, generator=gen),
            "w1": torch.randn(width, HIDDEN, generator=gen) / math.sqrt(HIDDEN),
            "b1": 0.1 * torch.randn(width, generator=gen),
            "w2": torch.randn(HIDDEN, FFN, generator=gen) / math.sqrt(FFN), "b2": 0.1 * torch.randn(HIDDEN, generator=gen)}


def _reference(activation: str, p: dict, x: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    leaves = {k: v.float().clone().requires_grad_() for k, v in {**p, "x": x}.items()}
    h = torch.nn.functional.layer_norm(leaves["x"], (HIDDEN,), leaves["ln_w"], leaves["ln_b"], 1e-5)
    y = torch.nn.functional.linear(_act(activation, torch.nn.functional.linear(h, leaves["w1"], leaves["b1"])),
                                   leaves["w2"], leaves["b2"])
    y.backward(dy.float())
    return {"y": y.detach(), **{k: v.grad for k, v in leaves.items()}}


def _te_run(te, recipe, activation: str, p: dict, x: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    module = te.LayerNormMLP(HIDDEN, FFN, activation=activation, params_dtype=torch.bfloat16, device="cpu")
    names = {"ln_w": "layer_norm_weight", "ln_b": "layer_norm_bias", "w1": "fc1_weight", "b1": "fc1_bias",
             "w2": "fc2_weight", "b2": "fc2_bias"}
    with torch.no_grad():
        for k, attr in names.items():
            getattr(module, attr).copy_(p[k])
    xt = x.clone().requires_grad_()
    torch.manual_seed(5)  # NVFP4's stochastic rounding draws from the default generator
    with te.autocast(enabled=True, recipe=recipe):
        y = module(xt)
    y.backward(dy)
    return {"y": y.detach(), "x": xt.grad, **{k: getattr(module, attr).grad for k, attr in names.items()}}


def compare(te, recipe_name: str, recipe, activation: str) -> list[str]:
    """The failures of one LayerNormMLP run: each tensor (output, gradients) beyond its normwise bound."""
    gen = torch.Generator().manual_seed(12)
    p = {k: v.to(torch.bfloat16) for k, v in _params(activation).items()}
    x = torch.randn(TOKENS, HIDDEN, generator=gen).to(torch.bfloat16)
    dy = (torch.randn(TOKENS, HIDDEN, generator=gen) / math.sqrt(TOKENS)).to(torch.bfloat16)
    got, want = _te_run(te, recipe, activation, p, x, dy), _reference(activation, p, x, dy)
    failures = []
    for name, w in want.items():
        error = float((got[name].float() - w).norm() / w.norm())
        if not error <= NORMWISE[recipe_name]:
            failures.append(f"{activation}/{name}: normwise error {error:.4f} beyond {NORMWISE[recipe_name]}")
    return failures


def gated_mxfp8_exact(tex, mxfp8_quantizer) -> list[str]:
    """swiglu / dswiglu / geglu with an MXFP8 quantizer equal quantize(their values rounded to bf16), bitwise."""
    from te_verify.te.tecpu import quantize

    gen = torch.Generator().manual_seed(13)
    x = (torch.randn(64, 128, generator=gen) * 0.75).to(torch.bfloat16)
    dy = (torch.randn(64, 64, generator=gen) * 0.75).to(torch.bfloat16)
    calls = {"swiglu": lambda q, a, g: tex.swiglu(a, q), "geglu": lambda q, a, g: tex.geglu(a, q),
             "dswiglu": lambda q, a, g: tex.dswiglu(g, a, q)}
    failures = []
    for name, call in calls.items():
        got = call(mxfp8_quantizer(), x, dy)
        want = quantize.quantize(call(None, x.float(), dy.float()).to(torch.bfloat16), mxfp8_quantizer())
        for attr in ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv"):
            bad = int((getattr(got, attr).view(torch.uint8) != getattr(want, attr).view(torch.uint8)).sum())
            if bad:
                failures.append(f"{name} MXFP8: {attr} differs in {bad} bytes")
    return failures


def main() -> dict[str, list[str]]:
    from te_verify.te import tecpu

    tecpu.boot("sm100")
    import transformer_engine.pytorch as te
    import transformer_engine_torch as tex
    from transformer_engine.common import recipe
    from transformer_engine.pytorch.tensor import mxfp8_tensor

    recipes = {"mxfp8": recipe.MXFP8BlockScaling(), "nvfp4": recipe.NVFP4BlockScaling()}
    out = {f"{r} {a}": compare(te, r, rec, a) for r, rec in recipes.items() for a in ACTIVATIONS}
    out["gated mxfp8 exact"] = gated_mxfp8_exact(
        tex, lambda: mxfp8_tensor.MXFP8Quantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=True))
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
