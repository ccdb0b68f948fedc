"""te.Linear forward + backward under a block-scaling recipe over the tex emulation, held to an independent
dequantize-then-matmul written here from the formats' definitions (float64, index arithmetic, no te_verify code).

Every GEMM's operands are captured at tex.generic_gemm and dequantized here: MXFP8 as E4M3 * 2^(e8m0 - 127), FP8
block scaling as E4M3 * fp32 scale_inv (GEMM-ready layouts), NVFP4 as E2M1 * E4M3 scale * amax / (6 * 448), GEMM-
swizzled scales read through cuBLAS's 128x4 tile formula. Checked:
- y = x_q W_q^T + b, dx = dy_q W_q, dW = dy_q^T x_q (the operands each GEMM read), db = sum(dy): TE's results within
  one bf16 rounding (plus fp32 accumulation);
- each operand is its source (W, x, dy; the RHT of x^T and dy^T for NVFP4's wgrad) quantized: every element within
  half a grid step (a full step under stochastic rounding) at the block scale the format's rule gives.
The same for each group of a 2-group te.GroupedLinear (te_general_grouped_gemm). Run as a script
(`python tests/block_recipe_e2e.py sm100 mxfp8 nvfp4 block`) it boots TE at that capability, runs each recipe's
Linear and GroupedLinear clean and its Linear under every planted fault of planted_block_quantizers, and prints
{run: failures} as JSON.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

GEMM_ARGS = ("A", "transA", "B", "transB")
SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]  # TE's get_wgrad_sign_vector
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def unswizzle(buffer: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Compact (rows, cols) from a 128x4-tiled buffer: entry (r, c) at ((r//128) * tiles_c + c//4) * 512 +
    (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4."""
    tiles_c = -(-cols // 4)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    offset = ((r // 128) * tiles_c + c // 4) * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4
    return buffer.reshape(-1)[offset]


def scales_of(buffer: torch.Tensor, rows: int, cols: int, swizzled: bool, transposed: bool = False) -> torch.Tensor:
    if not swizzled:
        return buffer[:rows, :cols]
    return unswizzle(buffer, cols, rows).t() if transposed else unswizzle(buffer, rows, cols)


def dq_mxfp8(t, rowwise: bool) -> torch.Tensor:
    data = (t._rowwise_data if rowwise else t._columnwise_data)
    data = data.reshape(-1, data.shape[-1])
    m, k = data.shape
    buf = t._rowwise_scale_inv if rowwise else t._columnwise_scale_inv
    e = scales_of(buf, m, k // 32, t._with_gemm_swizzled_scales) if rowwise else \
        scales_of(buf, m // 32, k, t._with_gemm_swizzled_scales, transposed=True)
    scale = torch.exp2(e.double() - 127)
    scale = scale.repeat_interleave(32, 1) if rowwise else scale.repeat_interleave(32, 0)
    fp8 = torch.float8_e4m3fn if t._fp8_dtype.name == "kFloat8E4M3" else torch.float8_e5m2
    return data.view(fp8).double() * scale


def dq_block(t, rowwise: bool) -> torch.Tensor:
    data = t._rowwise_data if rowwise else t._columnwise_data
    data = data.reshape(-1, data.shape[-1]) if rowwise else data.reshape(data.shape[0], -1)
    m, k = data.shape
    buf = (t._rowwise_scale_inv if rowwise else t._columnwise_scale_inv).double()
    if t._is_2D_scaled:
        per = buf[:, :].repeat_interleave(128, 0).repeat_interleave(128, 1)[:m, :k]
    else:
        per = buf[:, :m].t().repeat_interleave(128, 1)[:, :k]
    values = data.view(torch.float8_e4m3fn).double() * per
    return values if rowwise else values.t()


def dq_nvfp4(t, rowwise: bool) -> torch.Tensor:
    data = t._rowwise_data if rowwise else t._columnwise_data
    data = data.reshape(-1, data.shape[-1])
    codes = torch.stack([data & 0xF, data >> 4], -1).reshape(data.shape[0], -1).long()
    values = torch.tensor(E2M1, dtype=torch.float64)[codes & 7] * torch.where(codes >= 8, -1.0, 1.0).double()
    m, k = values.shape
    buf = t._rowwise_scale_inv if rowwise else t._columnwise_scale_inv
    s = scales_of(buf, m, k // 16, t._with_gemm_swizzled_scales).view(torch.float8_e4m3fn).double()
    amax = float(t._amax_rowwise if rowwise else t._amax_columnwise)
    values = values * s.repeat_interleave(16, 1) * amax / (6 * 448)
    return values if rowwise else values.t()


def dequantize(t, rowwise: bool) -> torch.Tensor:
    if isinstance(t, torch.Tensor) and not hasattr(t, "_rowwise_data"):
        return t.reshape(-1, t.shape[-1]).double()
    name = type(t).__name__
    reader = dq_mxfp8 if "MXFP8" in name else dq_nvfp4 if "NVFP4" in name else dq_block
    return reader(t, rowwise)


class Capture:
    """Wraps tex.generic_gemm and tex.te_general_grouped_gemm: per layout, per GEMM (per group) both operands
    dequantized here as read (A rowwise iff transposed, B rowwise iff not)."""

    def __init__(self) -> None:
        self.gemms: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.tex = sys.modules["transformer_engine_torch"]

    def _note(self, a, transa: bool, b, transb: bool) -> None:
        layout = ("T" if transa else "N") + ("T" if transb else "N")
        self.gemms.setdefault(layout, []).append((dequantize(a, transa), dequantize(b, not transb)))

    def __enter__(self) -> "Capture":
        self.originals = (self.tex.generic_gemm, self.tex.te_general_grouped_gemm)

        def generic_gemm(*args, **kwargs):
            named = dict(zip(GEMM_ARGS, args), **kwargs)
            self._note(named["A"], named["transA"], named["B"], named["transB"])
            return self.originals[0](*args, **kwargs)

        def grouped_gemm(a, transa, b, transb, *args, **kwargs):
            for a_i, b_i in zip(a, b):
                self._note(a_i, transa, b_i, transb)
            return self.originals[1](a, transa, b, transb, *args, **kwargs)
        self.tex.generic_gemm, self.tex.te_general_grouped_gemm = generic_gemm, grouped_gemm
        return self

    def __exit__(self, *exc) -> None:
        self.tex.generic_gemm, self.tex.te_general_grouped_gemm = self.originals


def rht_matrix() -> torch.Tensor:
    """diag(signs) @ H16 / 4 in float64, H16 the Sylvester Hadamard matrix."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return torch.diag(torch.tensor(SIGNS, dtype=torch.float64)) @ h / 4


def rht(x: torch.Tensor) -> torch.Tensor:
    """RHT of the columns of x (runs of 16 rows), float64 -> bf16, back in x's orientation."""
    return (x.t().double().reshape(-1, 16) @ rht_matrix()).reshape(x.shape[1], -1).to(torch.bfloat16).t()


def blocks(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Per element, the max |x| of its rows x cols block (a block past the edge covers what is inside)."""
    m, k = x.shape
    padded = torch.nn.functional.pad(x.abs(), (0, -k % cols, 0, -m % rows))
    amax = padded.reshape(-(-m // rows), rows, -(-k // cols), cols).amax(dim=(1, 3))
    return amax.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[:m, :k]


def fp8_half_ulp(v: torch.Tensor, min_exp: int = -6, mantissa: int = 3) -> torch.Tensor:
    exponent = torch.floor(torch.log2(v.clamp(min=2.0 ** min_exp)))
    return 2.0 ** (exponent - mantissa) / 2


def bound(recipe: str, src: torch.Tensor, direction: str, role: str) -> torch.Tensor:
    """Per element, the largest error the format's rule allows (direction "row": blocks along the last dim)."""
    x = src.double()
    if recipe == "mxfp8":
        s = torch.exp2(torch.ceil(torch.log2(blocks(x, *((1, 32) if direction == "row" else (32, 1))) / 448)))
        return fp8_half_ulp(x.abs() / s) * s
    if recipe == "block":
        two_d = role == "weight"
        shape = (128, 128) if two_d else ((1, 128) if direction == "row" else (128, 1))
        s = torch.exp2(torch.floor(torch.log2(448 / blocks(x, *shape))))
        return fp8_half_ulp(x.abs() * s) / s
    s_enc = 448 * 6 / x.abs().max()
    shape = (16, 16) if role == "weight" else ((1, 16) if direction == "row" else (16, 1))
    s_b = (blocks(x, *shape) * s_enc / 6).float().to(torch.float8_e4m3fn).double()
    d = s_b / s_enc
    v = x.abs() / d
    step = torch.where(v >= 4, 2.0, torch.where(v >= 2, 1.0, 0.5))
    # Under stochastic rounding (gradients) a full step; the 1/8 slack covers an E4M3 block scale one ulp away
    # from this float64 derivation (the kernel rounds amax_b * (S_enc * fp32(1/6)) in fp32).
    return step * d * (1.0 if role == "grad" else 0.5) * 1.125


def check_operand(recipe: str, name: str, got: torch.Tensor, src: torch.Tensor, direction: str, role: str) -> list[str]:
    allowed = bound(recipe, src, direction, role) * (1 + 1e-6) + 1e-30
    err = (got - src.double()).abs()
    bad = (err > allowed).nonzero()
    if bad.numel() == 0:
        return []
    i, j = bad[0].tolist()
    return [f"{recipe} {name}: {bad.shape[0]} elements off their quantization grid, first [{i},{j}]: "
            f"{got[i, j].item():.6g} for {src[i, j].item():.6g} (allowed error {allowed[i, j].item():.3g})"]


def check_result(recipe: str, name: str, got: torch.Tensor, want: torch.Tensor) -> list[str]:
    """Within one bf16 rounding of the float64 product (plus fp32 accumulation slack)."""
    got, want = got.double().reshape(want.shape), want
    excess = (got - want).abs() - 2.0 ** -8 * want.abs()
    worst = excess.max().item()
    if worst <= 1e-5 * want.abs().max().item():
        return []
    i, j = divmod(int(excess.argmax()), want.shape[1])
    return [f"{recipe} {name}: TE {got[i, j].item():.6g} vs dequantize-then-matmul {want[i, j].item():.6g} "
            f"at [{i},{j}]"]


def _layer(te, module: str, groups: int, features: int, outputs: int, tokens: int):
    """(the layer, its forward, its weights, its biases)."""
    if module == "linear":
        layer = te.Linear(features, outputs, bias=True, params_dtype=torch.bfloat16, device="cpu")
        return layer, layer, [layer.weight], [layer.bias]
    layer = te.GroupedLinear(groups, features, outputs, bias=True, params_dtype=torch.bfloat16, device="cpu")
    weights = [getattr(layer, f"weight{i}") for i in range(groups)]
    biases = [getattr(layer, f"bias{i}") for i in range(groups)]
    return layer, lambda x: layer(x, [tokens // groups] * groups), weights, biases


def run(te, recipe: str, make_recipe, module: str, tokens: int, features: int, outputs: int) -> list[str]:
    """One forward + backward of te.Linear (module "linear") or a 2-group te.GroupedLinear ("grouped"); the
    failures found (empty: all held)."""
    torch.manual_seed(1)
    groups = 1 if module == "linear" else 2
    _, forward, weights, biases = _layer(te, module, groups, features, outputs, tokens)
    x = torch.randn(tokens, features, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, outputs, dtype=torch.bfloat16)
    with Capture() as cap:
        with te.autocast(recipe=make_recipe(recipe)):
            y = forward(x)
        y.backward(dy)
    counts = {layout: len(cap.gemms.get(layout, [])) for layout in ("TN", "NN", "NT")}
    if sorted(cap.gemms) != ["NN", "NT", "TN"] or set(counts.values()) != {groups}:
        return [f"{recipe} {module}: GEMMs per layout {counts}, expected {groups} each of fprop TN, dgrad NN, wgrad NT"]
    failures, rows = [], tokens // groups
    for g, (w, b) in enumerate(zip(weights, biases)):
        part, tag = slice(g * rows, (g + 1) * rows), f"{module} group {g}" if groups > 1 else module
        (w_f, x_f), (w_d, dy_d), (x_w, dy_w) = (cap.gemms[layout][g] for layout in ("TN", "NN", "NT"))
        failures += check_result(recipe, f"{tag} y", y[part], x_f @ w_f.t() + b.double())
        failures += check_result(recipe, f"{tag} dx", x.grad[part], dy_d @ w_d)
        failures += check_result(recipe, f"{tag} dW", w.grad, dy_w.t() @ x_w)
        failures += check_result(recipe, f"{tag} db", b.grad.reshape(1, -1), dy[part].double().sum(0, keepdim=True))
        failures += _operands(recipe, tag, (w_f, x_f, w_d, dy_d, x_w, dy_w), w.detach(), x[part].detach(), dy[part])
    return failures


def _operands(recipe: str, tag: str, captured: tuple, w: torch.Tensor, x: torch.Tensor, dy: torch.Tensor) -> list[str]:
    w_f, x_f, w_d, dy_d, x_w, dy_w = captured
    rht_src = recipe == "nvfp4"  # NVFP4BlockScaling's wgrad operands: the RHT of x^T and dy^T
    failures = []
    for name, got, src, direction, role in (
            ("fprop W", w_f, w, "row", "weight"), ("fprop x", x_f, x, "row", "input"),
            ("dgrad W", w_d, w, "col", "weight"), ("dgrad dy", dy_d, dy, "row", "grad"),
            ("wgrad x", x_w, rht(x) if rht_src else x, "col", "input"),
            ("wgrad dy", dy_w, rht(dy) if rht_src else dy, "col", "grad")):
        failures += check_operand(recipe, f"{tag} {name}", got, src, direction, role)
    return failures


# tokens, in, out features: NVFP4 x (128, 128) gets GEMM-swizzled scales (RHT cast fusion), its W (64, 128) not
SHAPES = {"mxfp8": (128, 64, 32), "nvfp4": (128, 128, 64), "block": (256, 128, 128)}


def main(capability: str, recipes: list[str]) -> dict[str, list[str]]:
    sys.path.insert(0, str(Path(__file__).parent))
    from planted_block_quantizers import PLANTED
    from te_verify.te import tecpu
    from te_verify.te import api as te_api

    tecpu.boot(capability)
    import transformer_engine.pytorch as te

    api = te_api.resolve(te_api.CPU_CHOICE, capability).api
    make = lambda name: te_api.make_recipe(api, name)  # noqa: E731
    results = {}
    for recipe in recipes:
        for module in ("linear", "grouped"):
            results[f"{recipe} {module} clean"] = run(te, recipe, make, module, *SHAPES[recipe])
        for fault, plant in PLANTED.items():
            with plant():
                results[f"{recipe} linear {fault}"] = run(te, recipe, make, "linear", *SHAPES[recipe])
    return results


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
