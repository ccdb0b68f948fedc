"""Bytes of one layout of a quantized copy, per recipe, from the formats' storage rules (what a GEMM needs kept).

A layout is the data one GEMM operand reads with its scales: "rowwise" (blocks along the last dim: x and W in
fprop, dy in dgrad) or "columnwise" (blocks along the rows: W in dgrad, x and dy in wgrad). The scales are padded
as cuBLAS's block-scaled GEMMs read them (TE allocates them so: MXFP8Quantizer/NVFP4Quantizer/Float8BlockQuantizer
get_scale_shape; the TE-block-recipes note, section 1). For an (M, K) tensor:

- per-tensor FP8 (delayed, current): M*K bytes and one fp32 scale_inv;
- MXFP8: M*K bytes; E8M0 scales (1 byte) per 1x32 block, padded to (roundup(M, 128), roundup(K/32, 4)) rowwise,
  per 32x1 block padded to (roundup(M/32, 4), roundup(K, 128)) columnwise;
- FP8 block scaling: M*K bytes; fp32 scales per 1x128 block, (ceil(K/128), roundup(M, 4)) rowwise and
  (ceil(M/128), roundup(K, 4)) columnwise; a weight's 128x128 tiles (ceil(M/128), roundup(ceil(K/128), 4)) and
  its transpose;
- NVFP4: M*K/2 bytes (two E2M1 per byte); E4M3 scales per 16, padded to (roundup(M, 128), roundup(ceil(K/16), 4))
  rowwise, (roundup(K, 128), roundup(ceil(M/16), 4)) columnwise; and an fp32 per-tensor amax.
"""
from __future__ import annotations

import math

PER_TENSOR = ("delayed", "current")
# The spec's recipes whose GEMM operands are block-scaled copies (a CustomRecipe: its factory's backward format).
BLOCK_FORMAT = {"mxfp8": "mxfp8", "block": "block", "nvfp4": "nvfp4", "nvfp4_rn": "nvfp4", "custom": "mxfp8"}
LAYOUTS = ("rowwise", "columnwise")
# Recipes whose fprop GEMM reads high-precision operands (the custom factory's IdentityQuantizer rowwise copies).
HIGH_PRECISION_FPROP = ("custom",)


def _up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple


def _scales(fmt: str, m: int, k: int, layout: str, two_d: bool) -> int:
    """Bytes of the scales of one layout of an (m, k) tensor."""
    if fmt == "mxfp8":
        return _up(m, 128) * _up(k // 32, 4) if layout == "rowwise" else _up(m // 32, 4) * _up(k, 128)
    if fmt == "block" and two_d:
        tiles_m, tiles_k = math.ceil(m / 128), math.ceil(k / 128)
        return 4 * (tiles_m * _up(tiles_k, 4) if layout == "rowwise" else tiles_k * _up(tiles_m, 4))
    if fmt == "block":
        return 4 * (math.ceil(k / 128) * _up(m, 4) if layout == "rowwise" else math.ceil(m / 128) * _up(k, 4))
    if layout == "rowwise":  # nvfp4, with its per-tensor amax
        return _up(m, 128) * _up(math.ceil(k / 16), 4) + 4
    return _up(k, 128) * _up(math.ceil(m / 16), 4) + 4


def layout_storages(recipe: str, role: str, m: int, k: int, layout: str) -> list[tuple[str, int]]:
    """("data" | "scale_inv" | "amax", bytes) per storage of `layout` of the quantized copy of an (m, k) tensor in
    `role` ("input", "weight", "grad_output")."""
    if recipe in PER_TENSOR:
        return [("data", m * k), ("scale_inv", 4)]
    fmt = BLOCK_FORMAT[recipe]
    if fmt == "nvfp4":
        return [("data", m * k // 2), ("scale_inv", _scales(fmt, m, k, layout, False) - 4), ("amax", 4)]
    return [("data", m * k), ("scale_inv", _scales(fmt, m, k, layout, two_d=role == "weight"))]


def layout_bytes(recipe: str, role: str, m: int, k: int, layout: str) -> int:
    """Bytes of `layout` of the quantized copy of an (m, k) tensor in `role` (layout_storages summed)."""
    return sum(b for _, b in layout_storages(recipe, role, m, k, layout))


def backward_layout(recipe: str) -> str:
    """The layout dgrad reads of a weight and wgrad of an input: block-scaled copies' columnwise one (a per-tensor
    copy's one layout is counted once, whichever)."""
    return "columnwise" if recipe in BLOCK_FORMAT else "rowwise"
