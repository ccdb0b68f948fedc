"""tex's MXFP8 casts of a master-weight shard: mxfp8_scaling_compute_partial_amax and mxfp8_scaling_partial_cast, as
csrc/extensions/fp8_partial_cast.cpp and common/recipe/mxfp8_scaling.cu define them (main d0067d0; kernels, bindings
and keyword names the same from TE 2.14, where they appear, to 2.20). TE's cast_master_weights_to_fp8 reaches them for
MXFP8 weights (tensor/utils.py: Megatron's distributed optimizer, each rank holding a contiguous shard of the weight).

The shard is `input` (1-D, n elements), elements start_offset .. start_offset + n of the row-major rows x cols weight.
- partial amax: for every 1x32 (rowwise) and 32x1 (columnwise) block of the weight, the max |x| over the block's shard
  elements, taken from 0 with fmaxf (NaN skipped, inf kept), in the input's dtype (exact: it is one of the inputs).
  The kernel's 32 x 128 tiles write every block of the grid, 0 where the shard has none: amax_rowwise[:rows,
  :ceil(cols / 128) * 4] and amax_colwise[:rows / 32, :ceil(cols / 128) * 128]; the rest of the padded buffers keeps
  what was there.
- partial cast: each shard element x, in fp32, times exp2f_rcp of its block's E8M0 scale_inv (2^(127 - e), NaN for
  0xFF: mxfp8.e8m0_reciprocal), converted to E4M3 with cvt.rn.satfinite (te.fp8.quantize), rowwise and columnwise
  into the two 1-D outputs at the element's place in the shard. The scale buffers are read compact (row r, column c at
  r * shape[1] + c), whatever TE's swizzle flag says, as the kernel reads them.
Raised as TE raises: the binding's contiguity checks, every NVTE_CHECK (messages kept), the dtype switch (fp32, fp16,
bf16 input). Refused (strict): rows or cols < 1 (an empty grid) and weights of 2^31 elements or more (the kernel's int
index would overflow).
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te import fp8
from te_verify.te.tecpu import block_scales, mxfp8
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.writes import write

INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
OUTPUT_DTYPES = (torch.float8_e4m3fn, torch.uint8)
TILE_ROWS, TILE_COLS = 32, 128  # one thread block's tile
ROWWISE_PADDING, COLWISE_PADDING = (128, 4), (4, 128)  # (rows, cols) multiples of the scale / amax buffers
CHUNK_ELEMENTS = 1 << 22  # rows handled at once (memory only: every element's result is independent of the chunking)
INT_MAX = 2**31 - 1


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(message)


def _check_shard(input: torch.Tensor, rows: int, cols: int, start_offset: int, what: str) -> None:
    if start_offset < 0 or not all(-2**31 <= n <= INT_MAX for n in (rows, cols)):  # pybind's size_t and int
        raise TypeError(f"{what}(): incompatible function arguments (rows {rows}, cols {cols}, start_offset "
                        f"{start_offset})")
    _check(rows % 32 == 0, "rows must be divisible by 32")
    _check(cols % 32 == 0, "cols must be divisible by 32")
    _check(input.dim() == 1, "input must be a 1D tensor")
    if rows < 0 or cols < 0:  # the C++ converts them to size_t in its checks
        refuse(f"tex.{what} with rows {rows}, cols {cols}")
    _check(start_offset + input.shape[0] <= rows * cols, "Invalid start_offset")
    if rows == 0 or cols == 0:
        refuse(f"tex.{what} with rows {rows}, cols {cols} (an empty grid)")
    if rows * cols > INT_MAX:
        refuse(f"tex.{what} over a {rows} x {cols} weight (the kernel's int element index overflows)")


def _check_blocks(t: torch.Tensor, name: str, rows: int, cols: int, rowwise: bool) -> None:
    """The NVTE_CHECKs on an amax or scale_inv buffer (2-D, padded, covering the weight's blocks)."""
    row_pad, col_pad = ROWWISE_PADDING if rowwise else COLWISE_PADDING
    need_rows, need_cols = (rows, cols // 32) if rowwise else (rows // 32, cols)
    _check(t.dim() == 2, f"{name} must be a 2D tensor")
    _check(t.shape[0] % row_pad == 0, f"Wrong padding of {name}'s rows")
    _check(t.shape[0] >= need_rows, "Invalid rows")
    _check(t.shape[1] % col_pad == 0, f"Wrong padding of {name}'s cols")
    _check(t.shape[1] >= need_cols, "Invalid cols")


def _dtype_switch(input: torch.Tensor) -> None:
    """TRANSFORMER_ENGINE_TYPE_SWITCH_NON_FP8ONLY's error for any other input dtype."""
    _check(input.dtype in INPUT_DTYPES,
           f"Unsupported dtype {input.dtype}. Expected one of: Float32, Float16, BFloat16.")


def _chunks(input: torch.Tensor, rows: int, cols: int, start_offset: int):
    """Over 32-row chunks of the weight covering the shard: (first row, the chunk as a [k, cols] tensor in the input's
    dtype with 0 outside the shard, the shard's elements lo .. hi in the weight's flat order)."""
    end = start_offset + input.shape[0]
    if end == start_offset:
        return
    first_row = start_offset // cols // 32 * 32
    end_row = -(-end // (cols * 32)) * 32  # the rows touched, rounded out to whole 32-row blocks
    step = max(32, CHUNK_ELEMENTS // cols // 32 * 32)
    for r0 in range(first_row, end_row, step):
        r1 = min(r0 + step, end_row)
        lo, hi = max(start_offset, r0 * cols), min(end, r1 * cols)
        values = torch.zeros((r1 - r0) * cols, dtype=input.dtype, device=input.device)
        values[lo - r0 * cols:hi - r0 * cols] = input[lo - start_offset:hi - start_offset]
        yield r0, values.view(r1 - r0, cols), lo, hi


def mxfp8_scaling_compute_partial_amax(input: torch.Tensor, amax_rowwise: torch.Tensor, amax_colwise: torch.Tensor,
                                       rows: int, cols: int, start_offset: int) -> None:
    """The shard's per-block amaxes written into the two padded buffers (0 for blocks it does not touch)."""
    what = "mxfp8_scaling_compute_partial_amax"
    _check(input.is_contiguous(), "input must be contiguous")
    _check(amax_rowwise.is_contiguous(), "amax_rowwise must be contiguous")
    _check(amax_colwise.is_contiguous(), "amax_colwise must be contiguous")
    _check_shard(input, rows, cols, start_offset, what)
    _check_blocks(amax_rowwise, "amax_rowwise", rows, cols, rowwise=True)
    _check(amax_rowwise.dtype == input.dtype, "Wrong dtype of amax_rowwise")
    _check_blocks(amax_colwise, "amax_colwise", rows, cols, rowwise=False)
    _check(amax_colwise.dtype == input.dtype, "Wrong dtype of amax_colwise")
    _dtype_switch(input)
    tiles_x = -(-cols // TILE_COLS)
    write(amax_rowwise[:rows, :tiles_x * TILE_COLS // 32], 0)
    write(amax_colwise[:rows // 32, :tiles_x * TILE_COLS], 0)
    for r0, values, _, _ in _chunks(input, rows, cols, start_offset):
        k = values.shape[0]  # block_amax: fmaxf from 0, so NaN never wins and inf does
        write(amax_rowwise[r0:r0 + k, :cols // 32], block_scales.block_amax(values, 1, 32))
        write(amax_colwise[r0 // 32:(r0 + k) // 32, :cols], block_scales.block_amax(values, 32, 1))


def mxfp8_scaling_partial_cast(input: torch.Tensor, output_rowwise: torch.Tensor, output_colwise: torch.Tensor,
                               scale_inv_rowwise: torch.Tensor, scale_inv_colwise: torch.Tensor, rows: int, cols: int,
                               start_offset: int) -> None:
    """The shard cast to E4M3 with the given E8M0 scales, rowwise and columnwise, into the shard-sized outputs."""
    what = "mxfp8_scaling_partial_cast"
    for t, name in ((input, "input"), (output_rowwise, "output_rowwise"), (output_colwise, "output_colwise"),
                    (scale_inv_rowwise, "scale_inv_rowwise"), (scale_inv_colwise, "scale_inv_colwise")):
        _check(t.is_contiguous(), f"{name} must be contiguous")
    _check_shard(input, rows, cols, start_offset, what)
    _check(output_rowwise.dim() == 1, "output_rowwise must be a 1D tensor")
    _check(output_colwise.dim() == 1, "output_colwise must be a 1D tensor")
    _check(output_rowwise.shape[0] == input.shape[0], "Size of input and output_rowwise mismatch")
    _check(output_colwise.shape[0] == input.shape[0], "Size of input and output_colwise mismatch")
    _check(output_rowwise.dtype in OUTPUT_DTYPES, "output_rowwise should be e4m3 or uint8")
    _check(output_colwise.dtype in OUTPUT_DTYPES, "output_colwise should be e4m3 or uint8")
    _check_blocks(scale_inv_rowwise, "scale_inv_rowwise", rows, cols, rowwise=True)
    _check(scale_inv_rowwise.dtype == torch.uint8, "Wrong dtype of scale_inv_rowwise")
    _check_blocks(scale_inv_colwise, "scale_inv_colwise", rows, cols, rowwise=False)
    _check(scale_inv_colwise.dtype == torch.uint8, "Wrong dtype of scale_inv_colwise")
    _dtype_switch(input)
    for r0, values, lo, hi in _chunks(input, rows, cols, start_offset):
        k = values.shape[0]
        row_scale = block_scales.expand(mxfp8.e8m0_reciprocal(scale_inv_rowwise[r0:r0 + k, :cols // 32]), 1, 32)
        col_scale = block_scales.expand(mxfp8.e8m0_reciprocal(scale_inv_colwise[r0 // 32:(r0 + k) // 32, :cols]),
                                        32, 1)
        for out, scale in ((output_rowwise, row_scale), (output_colwise, col_scale)):
            data = fp8.quantize(values.float(), scale, torch.float8_e4m3fn).view(-1)[lo - r0 * cols:hi - r0 * cols]
            write(out[lo - start_offset:hi - start_offset], data.view(torch.uint8).view(out.dtype))


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    return {"mxfp8_scaling_compute_partial_amax": mxfp8_scaling_compute_partial_amax,
            "mxfp8_scaling_partial_cast": mxfp8_scaling_partial_cast}
