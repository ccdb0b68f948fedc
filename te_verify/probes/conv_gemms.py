"""A 1-D convolution whose kernel has size 1, or spans its whole input, is a (grouped) GEMM: LitGPT's fused-qkv LoRA B
runs as a grouped conv1d with kernel size 1, and thunder computes that convolution's weight gradient as a
convolution whose kernel spans the positions. The GEMMs such ops are, in the form the probes count GEMMs in.

At the dispatch level `F.conv1d` is `aten.convolution` and its backward `aten.convolution_backward`, one op for both
gradients. Each is split into (operands, output, FLOPs) per GEMM: the forward (input, weight); the input gradient
(weight, output gradient); the weight gradient (output gradient, input). All three cost what the forward does,
2 x output elements x the weight's per-output reduction (in-channels per group x kernel width). Operands are the
op's own tensors, so the probes name them by storage as they name a Linear's. Any other convolution (strided,
padded, transposed, a kernel sliding over positions) gives none.
"""
from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten
CONV_OPS = frozenset({aten.convolution, aten.convolution_backward})
Gemm = tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, int]  # (operands, output, FLOPs)


def _is_gemm(weight: torch.Tensor, out_positions: int, stride: Any, padding: Any, transposed: bool) -> bool:
    return (weight.dim() == 3 and (weight.shape[-1] == 1 or out_positions == 1) and not transposed
            and all(s == 1 for s in stride) and all(p == 0 for p in padding))


def conv_gemms(func: Any, args: tuple, out: Any) -> list[Gemm]:
    """The GEMMs a convolution op ran (none unless it is one, see the module docstring)."""
    if func.overloadpacket is aten.convolution:
        x, weight, _, stride, padding, _, transposed = args[:7]
        if not _is_gemm(weight, out.shape[-1], stride, padding, transposed):
            return []
        return [((x, weight), out, 2 * out.numel() * weight.shape[1] * weight.shape[2])]
    grad_out, x, weight, _, stride, padding, _, transposed, _, _, mask = args[:11]
    if not _is_gemm(weight, grad_out.shape[-1], stride, padding, transposed):
        return []
    flops = 2 * grad_out.numel() * weight.shape[1] * weight.shape[2]
    grad_in, grad_weight = out[0], out[1]
    found = []
    if mask[0] and grad_in is not None:
        found.append(((weight, grad_out), grad_in, flops))
    if mask[1] and grad_weight is not None:
        found.append(((grad_out, x), grad_weight, flops))
    return found
