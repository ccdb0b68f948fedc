"""The GEMM-family aten ops the dispatch watcher counts, where their two operands sit, and a GEMM's FLOPs."""
from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten
# Every GEMM-family aten op, with the positions of its two operands. Keyed by overload packet, so every overload
# counts: out= (mm.out: inductor's extern kernels write into their buffers), dtype variants; the in-place ops are
# packets of their own (addmm_). matmul, linear and einsum are composite: they reach dispatch as these. A GEMM whose
# result is thrown away is counted all the same: it is work.
GEMM_OPERANDS: dict[Any, tuple[int, int]] = {
    aten.mm: (0, 1), aten.bmm: (0, 1), aten.addmm: (1, 2), aten.addmm_: (1, 2), aten.baddbmm: (1, 2),
    aten.baddbmm_: (1, 2), aten.addbmm: (1, 2), aten.addbmm_: (1, 2), aten._addmm_activation: (1, 2),
    aten.mv: (0, 1), aten.addmv: (1, 2), aten.addmv_: (1, 2), aten._scaled_mm: (0, 1), aten._int_mm: (0, 1),
}


def gemm_flops(a: torch.Tensor, b: torch.Tensor) -> int:
    """2*m*k*n (torch.utils.flop_counter's formula) from the operands: a is (..., m, k), b is (..., k, n) or a
    vector (n = 1); batch dims count (bmm, and addbmm, whose output has none)."""
    rows = a.numel() // a.shape[-1] if a.shape[-1] else 0
    return 2 * rows * a.shape[-1] * (b.shape[-1] if b.dim() >= 2 else 1)
