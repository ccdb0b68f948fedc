"""The block-scaled quantizers of the tex emulation held to hand-computed vectors from the formats' definitions
(no TE needed): E8M0 (OCP Microscaling Formats MX v1.0 §5.4.1: value 2^(e-127), 0xFF NaN) with TE's ceiling scale
rule, E4M3/E5M2 and E2M1 element bytes, NVFP4's two-level scaling (TE's NVFP4 documentation: per-tensor S_enc =
448 * 6 / amax, E4M3 block scales of amax_block / 6 * S_enc), FP8 block scaling's fp32 (power-of-2) scales, cuBLAS's
128x4 scale swizzle; edge values: zeros, subnormals, the format's maximum, NaN and inf, a block whose amax is 0.
Each planted fault of planted_block_quantizers fails the vectors it should, naming the element; its clean twin
(the emulation as shipped) passes them."""
from __future__ import annotations


import pytest
import torch

from planted_block_quantizers import PLANTED
from te_verify.te.tecpu import block_fp8, block_scales, mxfp8, nvfp4

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
NAN, INF = float("nan"), float("inf")
FP32_MAX = torch.finfo(torch.float32).max


def mismatches(got: list, want: list, what: str) -> list[str]:
    """One message per differing element, naming it (NaN equals NaN)."""
    same = lambda a, b: a == b or (a != a and b != b)  # noqa: E731
    return [f"{what}[{i}]: got {g!r}, want {w!r}" for i, (g, w) in enumerate(zip(got, want)) if not same(g, w)]


def one_block(values: list[float], block: int) -> torch.Tensor:
    """A (1, block) row: `values` then zeros."""
    x = torch.zeros(1, block)
    x[0, :len(values)] = torch.tensor(values)
    return x


# --- E8M0 (OCP MX v1.0) and TE's round-up of amax / fp8_max ---------------------------------------------------

E8M0_ENCODE = [  # (value, biased exponent): the next power of two >= value; 0, inf, NaN as TE's float_to_e8m0
    (0.0, 0), (1.0, 127), (1.5, 128), (2.0, 128), (0.75, 127), (2.0 ** -127, 0), (1.5 * 2.0 ** -127, 1),
    (2.0 ** -149, 0), (2.0 ** 127, 254), (1.5 * 2.0 ** 127, 254), (FP32_MAX, 254), (INF, 254), (NAN, 255)]
E8M0_DECODE = [(0, 2.0 ** -127), (1, 2.0 ** -126), (127, 1.0), (128, 2.0), (254, 2.0 ** 127), (255, NAN)]


def e8m0_failures() -> list[str]:
    got = mxfp8.e8m0_round_up(torch.tensor([v for v, _ in E8M0_ENCODE])).tolist()
    failures = mismatches(got, [e for _, e in E8M0_ENCODE], "e8m0_round_up")
    codes = torch.tensor([e for e, _ in E8M0_DECODE], dtype=torch.uint8)
    failures += mismatches(mxfp8.e8m0_value(codes).tolist(), [v for _, v in E8M0_DECODE], "e8m0 value")
    want_rcp = [1 / v if v == v else v for _, v in E8M0_DECODE]
    return failures + mismatches(mxfp8.e8m0_reciprocal(codes).tolist(), want_rcp, "e8m0 reciprocal")


# Rowwise 1x32 blocks: (elements, dtype, E8M0 scale, element bytes). scale_inv = 2^ceil(log2(amax / fp8_max)).
MXFP8_BLOCKS = [
    # amax 448 = E4M3 max: scale 1; 448 0x7E, 1.0 0x38, 0.5 0x30, min subnormal 2^-9 0x01, 2^-10 ties to 0,
    # 3 * 2^-10 ties to the even 2 * 2^-9 (0x02)
    ([448.0, -448.0, 1.0, 0.5, 0.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10], E4M3, 127,
     [0x7E, 0xFE, 0x38, 0x30, 0x00, 0x01, 0x00, 0x02]),
    ([0.0, -0.0], E4M3, 0, [0x00, 0x80]),  # amax 0: E8M0 0x00 (2^-127), zeros kept with their sign
    # amax 500 in (448, 512): TE's ceiling gives scale 2 (OCP's floor would give 1 and saturate 500 to 448)
    ([500.0, 448.0], E4M3, 128, [0x78, 0x76]),  # 250 -> 256 (0x78), 224 = 1.75 * 2^7 (0x76)
    ([1.0, 0.75], E4M3, 119, [0x78, 0x74]),  # amax 1: 1/448 -> 2^-8; 1 * 2^8 = 256, 0.75 * 2^8 = 192 (0x74)
    ([NAN, 2.0], E4M3, 120, [0x7F, 0x78]),  # NaN skipped by the amax (2/448 -> 2^-7), kept as NaN (0x7F)
    ([-NAN, 1.0], E5M2, 112, [0x7F, 0x78]),  # a negative NaN becomes the positive 0x7F, as PTX cvt.rn.satfinite
    ([INF, 1.0], E4M3, 254, [0x7E, 0x00]),  # amax inf: E8M0 0xFE; inf * 2^-127 saturates to 448, 1 flushes to 0
    ([2.0 ** -130], E4M3, 0, [0x20]),  # fp32 subnormal amax: scale 2^-127, 2^-130 * 2^127 = 0.125 (0x20)
    ([57344.0, 1.0], E5M2, 127, [0x7B, 0x3C]),  # E5M2 max: scale 1; 1.0 = 0x3C
    ([1.0], E5M2, 112, [0x78]),  # 1/57344 -> 2^-15; 1 * 2^15 = 0x78 in E5M2
]


def mxfp8_block_failures() -> list[str]:
    failures = []
    for values, dtype, scale, data in MXFP8_BLOCKS:
        got_data, got_scale = mxfp8.quantize(one_block(values, 32), dtype, columnwise=False)
        failures += mismatches(got_scale[0].tolist(), [scale], f"E8M0 scale of block {values}")
        failures += mismatches(got_data[0, :len(data)].tolist(), data, f"bytes of block {values}")
    return failures


def mxfp8_direction_failures() -> list[str]:
    """x[i, j] = 448 * 2^(i - 31) * (j + 1) / 32: row i's amax is 448 * 2^(i-31) (scale 2^(i-31)), column j's
    448 * (j + 1) / 32 (scale 2^ceil(log2((j+1)/32)))."""
    rows = 2.0 ** (torch.arange(32) - 31.0)
    x = 448 * rows[:, None] * (torch.arange(1, 33) / 32.0)[None, :]
    _, row_scales = mxfp8.quantize(x, E4M3, columnwise=False)
    _, col_scales = mxfp8.quantize(x, E4M3, columnwise=True)
    want_col = [127 + int(torch.ceil(torch.log2(torch.tensor((j + 1) / 32.0)))) for j in range(32)]
    return (mismatches(row_scales[:, 0].tolist(), [127 + i - 31 for i in range(32)], "rowwise E8M0 per row")
            + mismatches(col_scales[0].tolist(), want_col, "columnwise E8M0 per column"))


def mxfp8_dequantize_failures() -> list[str]:
    """Two blocks of one row, scales 2^3 and 2^-2: every byte decodes to its E4M3 value times its own block's."""
    data = torch.tensor([[0x38] * 32 + [0x40] * 32], dtype=torch.uint8)  # 1.0, then 2.0
    scales = torch.tensor([[130, 125]], dtype=torch.uint8)
    padded = block_scales.padded(scales, 128, 4)
    got = mxfp8.dequantize(data, block_scales.load(padded, 1, 2, swizzled=False), E4M3, columnwise=False)
    return mismatches([got[0, 0].item(), got[0, 40].item()], [8.0, 0.5], "MXFP8 dequantized (block 0, block 1)")


# --- NVFP4: E2M1 elements, E4M3 block scales, fp32 per-tensor scale ---------------------------------------------

E2M1_NEAREST = [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6), (6.0, 7), (7.0, 7),
                (-0.0, 8), (-0.1, 8), (-6.0, 15), (INF, 7), (-INF, 15), (NAN, 7), (0.3, 1), (2.6, 5)]


def e2m1_failures() -> list[str]:
    got = nvfp4.encode_nearest(torch.tensor([v for v, _ in E2M1_NEAREST])).tolist()
    failures = mismatches(got, [c for _, c in E2M1_NEAREST], "E2M1 code")
    codes = torch.arange(16, dtype=torch.uint8).reshape(1, 16)
    failures += mismatches(nvfp4.pack(codes)[0].tolist(), [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE],
                           "packed nibbles (element 2i low)")
    return failures + mismatches(nvfp4.decode(codes)[0].tolist(),
                                 [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], "E2M1 value")


NVFP4_SCALES = [  # (tensor amax, per-tensor S_enc), then blocks: (elements, tensor amax, E4M3 scale byte, codes)
    (2688.0, 1.0), (0.0, 1.0), (INF, 1.0), (1e-45, FP32_MAX), (10752.0, 0.25)]
NVFP4_BLOCKS = [
    # S_enc 1, amax_b 6: s_b = e4m3(6 * fp32(1/6)) = 1.0 (0x38); elements encode as themselves (ties to even)
    ([6.0, -6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.0, -0.5], 2688.0, 0x38, [7, 15, 0, 2, 2, 4, 4, 6, 6, 0, 9]),
    # S_enc = 2688 / 10752 = 0.25: s_b = e4m3(12 * 0.25 / 6) = 0.5 (0x30), decode step 0.5 / 0.25 = 2: 12 -> 6, 3 -> 1.5
    ([12.0, 3.0, -1.0], 10752.0, 0x30, [7, 3, 9]),
    ([0.0, -0.0], 2688.0, 0x00, [0, 8]),  # block amax 0: scale 0, elements times fp32 max (capped) stay zero
    ([448.0 * 6.0], 2688.0, 0x7E, [7]),  # block amax = tensor amax: s_b = 448 (E4M3 max 0x7E)
]


def nvfp4_scale_failures() -> list[str]:
    got = [nvfp4.global_encode_scale(torch.tensor(a)).item() for a, _ in NVFP4_SCALES]
    failures = mismatches(got, [s for _, s in NVFP4_SCALES], "S_enc for amax")
    for values, amax, scale, codes in NVFP4_BLOCKS:
        data, scales = nvfp4.quantize(one_block(values, 16), torch.tensor(amax))
        failures += mismatches(scales[0].tolist(), [scale], f"E4M3 block scale of {values} (tensor amax {amax})")
        failures += mismatches(nvfp4.unpack(data)[0, :len(codes)].tolist(), codes, f"E2M1 codes of {values}")
    return failures


def nvfp4_two_d_failures() -> list[str]:
    """A 16x32 tensor, left 16x16 tile amax 3, right tile amax 6 (in one row only): 2D scales per tile, every
    row's 1x16 blocks carrying its tile's scale."""
    x = torch.zeros(16, 32)
    x[5, 1], x[0, 20] = 3.0, 6.0
    _, scales = nvfp4.quantize(x, torch.tensor(2688.0), two_d=True)
    want = [0x30, 0x38]  # e4m3(3 / 6) = 0.5, e4m3(6 / 6) = 1
    return mismatches(scales[9].tolist(), want, "2D tile scales seen from row 9")


def nvfp4_dequantize_failures() -> list[str]:
    """Code 7 (6.0) under s_b 0.5 (0x30) and tensor amax 10752: 6 * 0.5 * 10752 / 2688 = 12."""
    data = torch.tensor([[0x07] + [0] * 7], dtype=torch.uint8)
    scales = torch.tensor([[0x30]], dtype=torch.uint8)
    stored = block_scales.load(block_scales.padded(scales, 128, 4), 1, 1, swizzled=False)
    got = nvfp4.dequantize(data, stored, torch.tensor(10752.0))
    return mismatches([got[0, 0].item()], [12.0], "NVFP4 dequantized element")


# --- FP8 block scaling: fp32 scale = fp8_max / amax (power of 2 rounded down), 1x128 and 128x128 blocks --------

BLOCK_FP8 = [  # (elements of one 1x128 block, pow2, epsilon, input dtype, scale_inv)
    ([448.0, 1.0], True, 0.0, torch.float32, 1.0),
    ([1.0], True, 0.0, torch.float32, 2.0 ** -8),  # 448 / 1 = 1.75 * 2^8, rounded down to 2^8
    ([1.0], False, 0.0, torch.float32, torch.tensor(1 / 448.0).item()),  # fp32 scale 448, scale_inv 1 / 448
    ([0.0], True, 0.0, torch.float32, 1.0),  # amax 0: scale 1
    ([0.0], True, 2.0 ** -4, torch.float32, 2.0 ** -12),  # epsilon floor 2^-4: 448 * 16 = 1.75 * 2^12 -> 2^12
    ([INF, 1.0], True, 0.0, torch.float32, 1.0),  # inf amax: scale 1
    ([1e-40], True, 0.0, torch.float32, 2.0 ** -127),  # 448 / 1e-40 overflows fp32: FLT_MAX, pow2 2^127
    ([1e-40], False, 0.0, torch.float32, 1 / FP32_MAX),
    ([1e-40], False, 0.0, torch.bfloat16, 1 / torch.finfo(torch.bfloat16).max),  # the input dtype's max
]


def block_fp8_failures() -> list[str]:
    failures = []
    for values, pow2, eps, dtype, scale_inv in BLOCK_FP8:
        data, got = block_fp8.quantize(one_block(values, 128).to(dtype), E4M3, False, pow2, eps)
        want = torch.tensor(scale_inv, dtype=torch.float32).item()
        failures += mismatches(got[0].tolist(), [want], f"scale_inv of {values} (pow2 {pow2}, eps {eps}, {dtype})")
    data, _ = block_fp8.quantize(one_block([448.0, 1.0, NAN, INF, 500.0], 128), E4M3, False, True, 0.0)
    failures += mismatches(data[0, :5].tolist(), [0x7E, 0x38, 0x7F, 0x7E, 0x7E], "bytes at scale 1 (inf amax)")
    x = torch.zeros(256, 128)
    x[3, 7], x[200, 100] = 1.0, 448.0  # 2D: tile (0, 0) amax 1, tile (1, 0) amax 448
    _, tiles = block_fp8.quantize(x, E4M3, True, True, 0.0)
    return failures + mismatches(tiles[:, 0].tolist(), [2.0 ** -8, 1.0], "128x128 tile scale_inv")


# --- cuBLAS's 128x4 swizzle ---------------------------------------------------------------------------------

def swizzle_failures() -> list[str]:
    """Entry (r, c) of a compact (256, 8) matrix lands at ((r//128) * 2 + c//4) * 512 + (r%32) * 16 + (r%128)//32 * 4
    + c%4: (33, 1) at 21, (130, 5) at 1569, (127, 3) at 31 * 16 + 3 * 4 + 3 = 511."""
    compact = torch.arange(256 * 8, dtype=torch.int32).reshape(256, 8)
    flat = block_scales.swizzle(compact)
    got = [flat[21].item(), flat[1569].item(), flat[511].item()]
    failures = mismatches(got, [33 * 8 + 1, 130 * 8 + 5, 127 * 8 + 3], "swizzled offset holds entry")
    back = block_scales.unswizzle(flat, 256, 8)
    return failures + ([] if torch.equal(back, compact) else ["unswizzle(swizzle(x)) != x"])


CHECKS = {"e8m0": e8m0_failures, "mxfp8_blocks": mxfp8_block_failures, "mxfp8_directions": mxfp8_direction_failures,
          "mxfp8_dequantize": mxfp8_dequantize_failures, "e2m1": e2m1_failures, "nvfp4_scales": nvfp4_scale_failures,
          "nvfp4_2d": nvfp4_two_d_failures, "nvfp4_dequantize": nvfp4_dequantize_failures,
          "block_fp8": block_fp8_failures, "swizzle": swizzle_failures}
# Planted fault -> the checks it must fail (every other check is not about it).
CAUGHT_BY = {"e8m0_rounded_down": ("e8m0", "mxfp8_blocks", "mxfp8_directions"),
             "neighbouring_block_scale": ("mxfp8_dequantize",),
             "nvfp4_per_tensor_scale_ignored": ("nvfp4_scales",)}


@pytest.mark.parametrize("check", CHECKS)
def test_clean_quantizers_match_hand_computed_vectors(check: str) -> None:
    failures = CHECKS[check]()
    assert failures == [], f"{check}: {len(failures)} mismatches: " + "; ".join(failures[:6])


@pytest.mark.parametrize("fault", CAUGHT_BY)
def test_planted_fault_fails_its_vectors_naming_the_element(fault: str) -> None:
    with PLANTED[fault]():
        caught = {check: CHECKS[check]() for check in CAUGHT_BY[fault]}
    silent = [check for check, failures in caught.items() if not failures]
    assert silent == [], f"planted {fault} passed {silent}"
    print(f"{fault}: " + "; ".join(f[0] for f in caught.values()))


def test_neighbouring_block_fault_reads_block_one_for_block_zero() -> None:
    with PLANTED["neighbouring_block_scale"]():
        failures = mxfp8_dequantize_failures()
    assert failures and "got 0.25, want 8.0" in failures[0], f"not the neighbour's scale: {failures}"


# --- stochastic rounding and the RHT ------------------------------------------------------------------------

def test_stochastic_rounding_lands_on_the_two_neighbours_with_tes_probabilities() -> None:
    """0.3 between 0 and 0.5 (step 0.5): t = 0.3 + u/256 * 0.5 reaches 0.5 for u >= 103, so 153 of the 256 byte
    values round up (probability 0.598 ~ 0.3 / 0.5); grid values never move; -2.6 goes to -2 or -3 (153 of 256
    to -3)."""
    u = torch.arange(256, dtype=torch.uint8)
    up = nvfp4.encode_stochastic(torch.full((256,), 0.3), u)
    assert set(up.tolist()) == {0, 1} and int((up == 1).sum()) == 153, f"0.3: {torch.bincount(up.long()).tolist()}"
    on_grid = torch.tensor([0.0, 0.5, 1.5, 3.0, 6.0, -4.0])
    for value in on_grid.tolist():
        codes = nvfp4.encode_stochastic(torch.full((256,), value), u)
        assert (codes == nvfp4.encode_nearest(torch.tensor([value]))).all(), f"grid value {value} moved"
    neg = nvfp4.encode_stochastic(torch.full((256,), -2.6), u)
    counts = torch.bincount(neg.long()).tolist()
    assert set(neg.tolist()) == {12, 13} and int((neg == 13).sum()) == 153, f"-2.6: {counts}"
    big = nvfp4.encode_stochastic(torch.tensor([7.0, NAN]), torch.tensor([255, 0], dtype=torch.uint8))
    assert big.tolist() == [7, 7], f"saturation / NaN under stochastic rounding: {big.tolist()}"


def test_rht_is_the_signed_hadamard_over_runs_of_16() -> None:
    """rht_matrix = diag(signs) @ H16 / 4 (Sylvester H16): unit vector e_3 (sign -1) maps to -H16[3] / 4, and the
    transform is orthogonal, so applying it and its transpose returns the input."""
    signs = torch.tensor([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1.0])
    h = torch.ones(1, 1)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    matrix = (torch.diag(signs) @ h / 4).to(torch.bfloat16)
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    x[1, 19] = 1.0  # second run of row 1, position 3
    out = nvfp4.hadamard(x, matrix)
    assert torch.equal(out[1, 16:].float(), -h[3] / 4) and not out[0].any() and not out[1, :16].any(), out[1]
    y = torch.randn(4, 64).to(torch.bfloat16)
    back = (nvfp4.hadamard(y, matrix).float().reshape(-1, 16) @ matrix.float().t()).reshape(4, 64)
    assert torch.allclose(back, y.float(), atol=2e-2), f"not orthogonal: {(back - y.float()).abs().max()}"


@pytest.mark.parametrize("two_d, row_scaled, stochastic", [(False, False, False), (True, False, False),
                                                            (False, True, False), (False, False, True)],
                         ids=["1d", "2d", "row_scaled", "stochastic"])
def test_nvfp4_encoded_in_row_runs_equals_at_once(monkeypatch, two_d: bool, row_scaled: bool, stochastic: bool) -> None:
    """nvfp4.quantize encodes large inputs in runs of whole 16-row tiles (a 16384 x 16384 input in one piece took
    19.7 GB): bitwise the same data and scales as in one piece, for 1D and 2D tiles, one amax per row, random bytes."""
    torch.manual_seed(9)
    x = torch.randn(96, 64) * torch.logspace(-3, 3, 64)
    amax = x.abs().amax(dim=1) if row_scaled else x.abs().max().reshape(1)
    bits = torch.randint(0, 256, x.shape, dtype=torch.uint8) if stochastic else None
    whole = nvfp4.quantize(x, amax, two_d, bits)
    monkeypatch.setattr(nvfp4, "CHUNK_ELEMENTS", 32 * 64)  # runs of 32 rows
    runs = nvfp4.quantize(x, amax, two_d, bits)
    assert torch.equal(runs[0], whole[0]) and torch.equal(runs[1], whole[1]), "row runs differ from one piece"


@pytest.mark.parametrize("rows, cols, block_rows, block_cols", [(32, 64, 1, 16), (32, 64, 16, 16), (0, 32, 1, 16),
                                                                (64, 96, 1, 32), (256, 256, 128, 128)])
def test_block_scales_times_is_each_element_times_its_blocks_scale(rows, cols, block_rows, block_cols):
    g = torch.Generator().manual_seed(rows + cols + block_rows)
    values = torch.randn(rows, cols, generator=g)
    scales = torch.rand(rows // block_rows, cols // block_cols, generator=g) * 100
    want = values * block_scales.expand(scales, block_rows, block_cols)
    assert torch.equal(block_scales.times(values, scales, block_rows, block_cols).view(torch.int32),
                       want.view(torch.int32))

