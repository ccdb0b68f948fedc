"""NVFP4 4over6 (NVFP4BlockScaling(nvfp4_4over6=...)) over the emulation, against the recipe's definition computed
here block by block in numpy fp32 scalars (TE main's quantize_4over6_nvfp4.cuh; te_verify/te/tecpu/nvfp4_4over6.py's
docstring states it): per 16-element block (or 16x16 tile, 2D) a map-to-6 candidate under the scale
e4m3(block_amax / 6 * S_enc) and a map-to-4 one under 1.5 times that, S_enc = E * 6 / amax with E the quantizer's
nvfp4_e4m3_max; the candidate with the strictly lower error (MAE or MSE of its dequantized values, or in the scaled
domain under NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH=1) is stored. TE's own NVFP4Quantizer quantizes. A tensor with
E = 256 dequantizes by fp32(1 / (6 * 256)) and enters cuBLAS's alpha with its own E (TE main's dequantize_nvfp4.cuh,
nvfp4.cu). Planted faults (always map-to-6; the 256 bound ignored in the scales, in dequantize, in the alpha) fail
for their reason. The fast-math error (in the S_enc-scaled domain, proportional to the exact one but for rounding)
picks the same candidates as the exact error on these data: its items check it, no planted fault tells them apart."""
from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import gemm, nvfp4, nvfp4_4over6

F = np.float32
FLT_MAX = F(np.finfo(np.float32).max)
GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
GLOBAL_SCALE = nvfp4.global_encode_scale  # the 448 default, for a planted fault


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    return types.SimpleNamespace(NVFP4=NVFP4Quantizer, FP4=tex.DType.kFloat4E2M1)


def e2m1_code(v: np.float32) -> int:
    """Round to nearest on the E2M1 grid, ties to the even code, saturating at 6; sign in bit 3."""
    a = min(abs(float(v)), 6.0)
    code = min(range(8), key=lambda i: (abs(GRID[i] - a), i % 2))
    return code + 8 * int(math.copysign(1.0, float(v)) < 0)


def e4m3(v: np.float32) -> np.float32:
    """E4M3 (round to nearest even) of a value already capped at 448."""
    return F(torch.tensor(float(v), dtype=torch.float32).to(torch.float8_e4m3fn).float().item())


def candidate(block: list[np.float32], scale: np.float32, s_enc: np.float32, amax: np.float32, e4m3_max: int,
              mse: bool, fast: bool) -> tuple[list[int], np.float32]:
    """(codes, error) of one candidate: q = e2m1(x * min(1 / (s * (1 / S_enc)), max)); the error of every element
    added in order."""
    inverse = min(F(1) / (scale * (F(1) / s_enc)), FLT_MAX)
    codes, err = [], F(0)
    for x in block:
        code = e2m1_code(x * inverse)
        q = F(-GRID[code & 7] if code & 8 else GRID[code & 7])
        d = q * scale - x * s_enc if fast else (q * scale * amax) / F(6 * e4m3_max) - x
        err = err + (d * d if mse else abs(d))
        codes.append(code)
    return codes, err


def tree_sum(errors: list[np.float32]) -> np.float32:
    """16 rows' errors as the kernel's warp shuffle adds them: i + (i + 8), then + 4, + 2, + 1."""
    while len(errors) > 1:
        half = len(errors) // 2
        errors = [errors[i] + errors[i + half] for i in range(half)]
    return errors[0]


def by_definition(x: torch.Tensor, e4m3_max: int, mse: bool, fast: bool, two_d: bool,
                  row_amax: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(E2M1 codes (M, K), scale bytes (M, K/16), whether map-to-4 won (per block or tile)) of a 2-D matrix;
    `row_amax`: one amax per row."""
    xs = x.float().numpy().astype(F)
    m, k = xs.shape
    codes, scales = np.zeros((m, k), np.int64), np.zeros((m, k // 16), np.uint8)
    rows = 16 if two_d else 1
    map4 = np.zeros((m // rows, k // 16), bool)
    with np.errstate(divide="ignore", over="ignore"):
        for r0 in range(0, m, rows):
            for c0 in range(0, k, 16):
                tile = xs[r0:r0 + rows, c0:c0 + 16]
                amaxes = [F(np.abs(xs[r]).max()) if row_amax else F(np.abs(xs).max()) for r in range(r0, r0 + rows)]
                results = {}
                for name, expand in (("map4", F(1.5)), ("map6", F(1))):
                    per_row = []
                    for i in range(rows):
                        s_enc = min(F(e4m3_max * 6) / amaxes[i], FLT_MAX)
                        s_enc = F(1) if amaxes[i] == 0 or s_enc == 0 else s_enc
                        scale = e4m3(min(F(np.abs(tile).max()) / F(6) * s_enc * expand, F(448)))
                        per_row.append((scale, *candidate(list(tile[i]), scale, s_enc, amaxes[i], e4m3_max, mse,
                                                          fast)))
                    results[name] = per_row
                err = {name: tree_sum([e for _, _, e in per_row]) for name, per_row in results.items()}
                map4[r0 // rows, c0 // 16] = err["map4"] < err["map6"]
                pick = results["map4" if map4[r0 // rows, c0 // 16] else "map6"]
                for i, (scale, row_codes, _) in enumerate(pick):
                    codes[r0 + i, c0:c0 + 16] = row_codes
                    scales[r0 + i, c0 // 16] = torch.tensor(float(scale)).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes, scales, map4


def sample(rows: int, cols: int, seed: int) -> torch.Tensor:
    """bf16 data whose blocks pick both candidates: Gaussian 16x16 tiles and, in a checkerboard, tiles on the map-to-4
    grid (0.5 * {0, 0.5, 1, 1.5, 2, 3, 4}, each row holding 2). The tensor amax is 3, so with E = 256 S_enc = 512, the
    map-to-4 scale of a grid block e4m3(2 / 6 * 512 * 1.5) = 256 is exact and map-to-4 reproduces it with no error."""
    torch.manual_seed(seed)
    x = (torch.randn(rows, cols) * 0.5).clamp(-2.9, 2.9)
    grid = 0.5 * torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0])
    on_grid = grid[torch.randint(0, 7, (rows, cols))] * (torch.randint(0, 2, (rows, cols)) * 2 - 1)
    on_grid[:, ::16] = 2.0
    tiles = torch.arange(rows).reshape(-1, 1) // 16 + torch.arange(cols) // 16
    x = torch.where(tiles % 2 == 1, on_grid, x)
    x[0, 0] = 3.0
    return x.to(torch.bfloat16)


def unpack(data: torch.Tensor) -> np.ndarray:
    d = data.reshape(data.shape[0], -1)
    return torch.stack([d & 0xF, d >> 4], dim=-1).reshape(d.shape[0], -1).long().numpy()


def quantize_failures(te, x: torch.Tensor, e4m3_max: int, mode: str, fast: bool, two_d: bool,
                      row_scaled: bool = False) -> list[str]:
    """Rowwise and (unless row-scaled) columnwise copies of TE's 4over6 quantizer against the definition."""
    q = te.NVFP4(fp4_dtype=te.FP4, rowwise=True, columnwise=not row_scaled, with_2d_quantization=two_d,
                 row_scaled_nvfp4=row_scaled, nvfp4_use_4over6=True, nvfp4_e4m3_max=e4m3_max,
                 nvfp4_4over6_err_mode=mode)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1" if fast else "0")
        qx = q(x)
    failures = []
    copies = [("rowwise", x, qx._rowwise_data, qx._rowwise_scale_inv)]
    if not row_scaled:
        copies.append(("columnwise", x.t(), qx._columnwise_data, qx._columnwise_scale_inv))
    for name, src, data, buffer in copies:
        codes, scales, _ = by_definition(src, e4m3_max, mode == "MSE", fast, two_d, row_scaled)
        wrong_codes = int((unpack(data) != codes).sum())
        wrong_scales = int((buffer[:scales.shape[0], :scales.shape[1]].numpy() != scales).sum())
        if wrong_codes or wrong_scales:
            failures.append(f"{name}: {wrong_codes} of {codes.size} codes, {wrong_scales} of {scales.size} scales "
                            "differ from the definition")
    assert qx._nvfp4_use_4over6 and qx._nvfp4_e4m3_max == e4m3_max
    return failures


@pytest.mark.parametrize("e4m3_max", [448, 256])
@pytest.mark.parametrize("mode", ["MAE", "MSE"])
@pytest.mark.parametrize("fast", [False, True], ids=["exact_err", "fast_err"])
def test_4over6_1d_matches_the_definition(te, e4m3_max: int, mode: str, fast: bool) -> None:
    assert quantize_failures(te, sample(32, 64, seed=1), e4m3_max, mode, fast, two_d=False) == []


@pytest.mark.parametrize("mode", ["MAE", "MSE"])
def test_4over6_2d_tiles_match_the_definition(te, mode: str) -> None:
    assert quantize_failures(te, sample(64, 64, seed=2), 256, mode, fast=False, two_d=True) == []


def test_4over6_row_scaled_matches_the_definition(te) -> None:
    assert quantize_failures(te, sample(32, 64, seed=3), 256, "MAE", fast=False, two_d=False, row_scaled=True) == []


@pytest.mark.parametrize("two_d", [False, True], ids=["1d", "2d"])
def test_the_data_exercise_both_candidates(two_d: bool) -> None:
    """Else always-map-to-6 would pass: the definition picks map-to-4 for some blocks and map-to-6 for others."""
    x = sample(64, 64, seed=2 if two_d else 1)
    picked = by_definition(x, 256, False, False, two_d)[2]
    assert 0 < picked.sum() < picked.size, f"map-to-4 picked for {picked.sum()} of {picked.size} blocks"


def dequantize_failures(te, x: torch.Tensor, e4m3_max: int) -> list[str]:
    """TE's dequantize of a 4over6 tensor: q * (s * amax * fp32(1 / (6 * E))) (dequantize_nvfp4.cuh, E4M3_MAX=E)."""
    q = te.NVFP4(fp4_dtype=te.FP4, rowwise=True, columnwise=False, nvfp4_use_4over6=True, nvfp4_e4m3_max=e4m3_max)
    qx = q(x)
    codes, scales, _ = by_definition(x, e4m3_max, False, False, False)
    amax, factor_inv = F(np.abs(x.float().numpy()).max()), F(1) / F(6 * e4m3_max)
    want = np.zeros(codes.shape, F)
    for r, c in np.ndindex(*codes.shape):
        value = F(-GRID[codes[r, c] & 7] if codes[r, c] & 8 else GRID[codes[r, c] & 7])
        s = F(torch.tensor([int(scales[r, c // 16])], dtype=torch.uint8).view(torch.float8_e4m3fn).item())
        want[r, c] = value * (s * amax * factor_inv)
    wrong = int((qx.dequantize(dtype=torch.float32).numpy() != want).sum())
    return [f"{wrong} of {want.size} dequantized values differ from the definition"] if wrong else []


def test_dequantize_uses_the_tensors_e4m3_max(te) -> None:
    assert dequantize_failures(te, sample(32, 64, seed=1), 256) == []


def test_planted_dequantize_with_448_is_caught(te, monkeypatch) -> None:
    original = nvfp4.dequantize_factor
    monkeypatch.setattr(nvfp4, "dequantize_factor", lambda e4m3_max: original(448))
    assert dequantize_failures(te, sample(32, 64, seed=1), 256) == [
        "1837 of 2048 dequantized values differ from the definition"]


def alpha_failures(e4m3_a: int, e4m3_b: int) -> list[str]:
    """cuBLAS's alpha (nvfp4.cu): 1 * amax_A * amax_B * fp32(1 / (6 * 6 * E_A * E_B)), each operand's own E."""
    want = F(1) * F(2.5) * F(7.25) * (F(1) / F(36 * e4m3_a * e4m3_b))
    one = torch.zeros(1, 16)
    one[0, 0] = 1.0
    a = (one, nvfp4.GlobalScale(torch.tensor(2.5), e4m3_a), "NVFP4Quantizer")
    b = (one, nvfp4.GlobalScale(torch.tensor(7.25), e4m3_b), "NVFP4Quantizer")
    got = F(gemm.product(a, True, b, False).item())
    return [] if got == want else [f"alpha {float(got).hex()}, nvfp4.cu gives {float(want).hex()}"]


@pytest.mark.parametrize("e4m3_a, e4m3_b", [(256, 448), (256, 256), (448, 448)])
def test_gemm_alpha_reads_each_operands_e4m3_max(e4m3_a: int, e4m3_b: int) -> None:
    assert alpha_failures(e4m3_a, e4m3_b) == []


def test_planted_alpha_with_448_is_caught(monkeypatch) -> None:
    original = nvfp4.gemm_alpha
    monkeypatch.setattr(nvfp4, "gemm_alpha",
                        lambda a, b: original(a._replace(e4m3_max=448), b._replace(e4m3_max=448)))
    assert alpha_failures(256, 448) == ["alpha 0x1.50b07a0000000p-19, nvfp4.cu gives 0x1.269a6a0000000p-18"]


def zero_error(d: torch.Tensor, mse: bool) -> torch.Tensor:
    """Planted: every candidate's error 0, so every block ties and keeps map-to-6."""
    return torch.zeros(d.shape[0], d.shape[1] // 16)


# Planted fault -> (how to plant it, the configuration it runs, what the clean check then reports).
PLANTED = {
    "always_map6": (lambda mp: mp.setattr(nvfp4_4over6, "_block_error", zero_error), (256, "MAE", False, False),
                    ["rowwise: 891 of 2048 codes, 76 of 128 scales differ from the definition",
                     "columnwise: 960 of 2048 codes, 81 of 128 scales differ from the definition"]),
    "e4m3_256_ignored": (lambda mp: mp.setattr(nvfp4_4over6, "global_encode_scale",
                                               lambda amax, e4m3_max: GLOBAL_SCALE(amax)), (256, "MAE", False, False),
                         ["rowwise: 1397 of 2048 codes, 128 of 128 scales differ from the definition",
                          "columnwise: 1294 of 2048 codes, 128 of 128 scales differ from the definition"]),
}


@pytest.mark.parametrize("fault", PLANTED)
def test_planted_fault_is_caught(te, fault: str, monkeypatch) -> None:
    plant, (e4m3_max, mode, fast, two_d), caught = PLANTED[fault]
    plant(monkeypatch)
    assert quantize_failures(te, sample(32, 64, seed=1), e4m3_max, mode, fast, two_d) == caught
