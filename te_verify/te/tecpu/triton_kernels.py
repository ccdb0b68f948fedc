"""TE's triton kernel wrappers the emulated paths reach, in PyTorch; every other one stays a strict stub.

TE's `transformer_engine.pytorch.triton.*` modules launch triton kernels (no triton on a CPU machine); like the
tex functions, these are kernels, not TE's Python logic, so they are emulated at the wrapper's documented
contract, by module and name.
"""
from __future__ import annotations

from typing import Callable

import torch


def compute_grouped_dbias(dy: torch.Tensor, offsets: torch.Tensor, num_groups: int,
                          dbias: torch.Tensor | None = None) -> torch.Tensor:
    """dbias[g] += sum of dy's rows offsets[g]:offsets[g+1], in fp32 (the wrapper's documented contract)."""
    if dbias is None:
        dbias = torch.zeros(num_groups, dy.shape[1], dtype=torch.float32, device=dy.device)
    elif dbias.dtype != torch.float32:
        raise AssertionError(f"compute_grouped_dbias: dbias must be float32, got {dbias.dtype}")
    bounds = offsets.tolist()
    with torch.no_grad():
        for g in range(num_groups):
            dbias[g] += dy[bounds[g]:bounds[g + 1]].float().sum(0)
    return dbias


EMULATED: dict[str, dict[str, Callable]] = {
    "transformer_engine.pytorch.triton.grouped_dbias_dscales": {"compute_grouped_dbias": compute_grouped_dbias},
}
