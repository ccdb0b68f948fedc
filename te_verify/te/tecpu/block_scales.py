"""Scale-factor layouts the block-scaled formats share (MXFP8, NVFP4; FP8 block scaling pads only).

- Storage is padded: MXFP8/NVFP4 scale buffers are (roundup(rows, 128), roundup(cols, 4)) in the "swizzle space"
  (rows: the dimension the data runs along without blocking, cols: the blocks), as TE's get_scale_shape allocates.
  Padding is written as zeros here; TE's kernels leave it unset, so nothing may read it.
- cuBLAS's "1D block scaling factors layout" (https://docs.nvidia.com/cuda/cublas/#d-block-scaling-factors-layout),
  as TE's kernels write it when a storage has `_with_gemm_swizzled_scales`: 128x4 tiles of 512 bytes, tiles in
  row-major order, and inside a tile entry (row r, col c) at (r % 32) * 16 + (r // 32) * 4 + c
  (common/cast/mxfp8/swizzle.cuh gemm_swizzled_scale_idx; NVFP4's swizzle.cuh is byte-compatible).
"""
from __future__ import annotations

import torch

from te_verify.te.tecpu.writes import write

TILE_ROWS, TILE_COLS = 128, 4


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def padded(compact: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """`compact` in the top-left corner of a zero (rows, cols) tensor of its dtype."""
    out = torch.zeros(rows, cols, dtype=compact.dtype, device=compact.device)
    out[:compact.shape[0], :compact.shape[1]] = compact
    return out


def swizzle(compact: torch.Tensor) -> torch.Tensor:
    """The flat GEMM-swizzled buffer of a compact (rows, cols) scale matrix (padded to 128x4 tiles)."""
    rows, cols = round_up(compact.shape[0], TILE_ROWS), round_up(compact.shape[1], TILE_COLS)
    tiles = padded(compact, rows, cols).reshape(rows // 128, 4, 32, cols // 4, 4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1)


def unswizzle(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The compact (rows, cols) scale matrix from a GEMM-swizzled buffer (inverse of `swizzle`)."""
    rows_p, cols_p = round_up(rows, TILE_ROWS), round_up(cols, TILE_COLS)
    tiles = flat.reshape(-1)[:rows_p * cols_p].reshape(rows_p // 128, cols_p // 4, 32, 4, 4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(rows_p, cols_p)[:rows, :cols]


def store(buffer: torch.Tensor, compact: torch.Tensor, swizzled: bool, transposed: bool = False) -> None:
    """Write a compact scale matrix into its storage buffer, compact-padded or GEMM-swizzled. `transposed`: the
    swizzle tiles the transposed matrix (MXFP8's columnwise scales, whose data is not transposed)."""
    if swizzled:
        flat = swizzle(compact.t() if transposed else compact)
        if flat.numel() != buffer.numel():
            raise RuntimeError(f"scale buffer of shape {tuple(buffer.shape)} cannot hold swizzled scales of "
                               f"{tuple(compact.shape)}")
        write(buffer.reshape(-1), flat.view(buffer.dtype))
    else:
        write(buffer, 0)
        write(buffer[:compact.shape[0], :compact.shape[1]], compact.view(buffer.dtype))


def load(buffer: torch.Tensor, rows: int, cols: int, swizzled: bool, transposed: bool = False) -> torch.Tensor:
    """The compact (rows, cols) scales a storage buffer holds (`transposed` as for `store`)."""
    if not swizzled:
        return buffer[:rows, :cols]
    return unswizzle(buffer, cols, rows).t() if transposed else unswizzle(buffer, rows, cols)


def expand(scales: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """One scale per element: each block's scale repeated over its block_rows x block_cols elements."""
    return scales.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)


def times(values: torch.Tensor, scales: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """values * expand(scales, ...) without the per-element copy of the scales: each block times its scale by
    broadcasting (the same fp32 products)."""
    rows, cols = values.shape
    blocks = values.view(rows // block_rows, block_rows, cols // block_cols, block_cols)
    return (blocks * scales[:, None, :, None]).view(rows, cols)


def block_amax(x: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """max |x| per block of a 2-D fp32 tensor whose dims the blocks divide, as TE's kernels take it: fmaxf from 0,
    so NaN elements are skipped (an all-NaN block gives 0) and an inf is kept."""
    rows, cols = x.shape
    a = x.abs().nan_to_num(nan=0.0, posinf=float("inf"))
    return a.reshape(rows // block_rows, block_rows, cols // block_cols, block_cols).amax(dim=(1, 3))


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| of a whole tensor in fp32, NaN skipped, inf kept (0 for an empty tensor)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.detach().abs().float().nan_to_num(nan=0.0, posinf=float("inf")).max()
