"""TE's triton kernel wrappers the emulated paths reach, in PyTorch; every other one stays a strict stub.

TE's `transformer_engine.pytorch.triton.*` modules launch triton kernels (no triton on a CPU machine); like the
tex functions, these are kernels, not TE's Python logic, so they are emulated at the wrapper's documented
contract, by module and name.
"""
from __future__ import annotations

from typing import Callable

import torch

from te_verify.te.tecpu.writes import write


def _fp32_buffer(given: torch.Tensor | None, shape: tuple[int, ...], name: str, device: torch.device) -> torch.Tensor:
    """The wrapper's accumulator: a fresh fp32 zero tensor, or the given one (it must be fp32)."""
    if given is None:
        return torch.zeros(shape, dtype=torch.float32, device=device)
    if given.dtype != torch.float32:
        raise AssertionError(f"{name} must be float32, got {given.dtype}")
    return given


def compute_grouped_dbias(dy: torch.Tensor, offsets: torch.Tensor, num_groups: int,
                          dbias: torch.Tensor | None = None) -> torch.Tensor:
    """dbias[g] += sum of dy's rows offsets[g]:offsets[g+1], in fp32 (the wrapper's documented contract)."""
    dbias = _fp32_buffer(dbias, (num_groups, dy.shape[1]), "compute_grouped_dbias: dbias", dy.device)
    bounds = offsets.tolist()
    with torch.no_grad():
        for g in range(num_groups):
            write(dbias[g], dbias[g] + dy[bounds[g]:bounds[g + 1]].float().sum(0))
    return dbias


def compute_grouped_dbias_dscales(dy: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor, offsets: torch.Tensor,
                                  dbias: torch.Tensor | None = None, dscales: torch.Tensor | None = None,
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """For the tokens i of group g (rows offsets[g]:offsets[g+1]), in fp32 (the wrapper's documented contract):
    dbias[g, j] += sum_i dy[i, j] * scales[i]; dscales[i] += sum_j dy[i, j] * bias[g, j]."""
    num_groups = bias.shape[0]
    dbias = _fp32_buffer(dbias, (num_groups, dy.shape[1]), "compute_grouped_dbias_dscales: dbias", dy.device)
    dscales = _fp32_buffer(dscales, (dy.shape[0],), "compute_grouped_dbias_dscales: dscales", dy.device)
    bounds = offsets.tolist()
    with torch.no_grad():
        for g in range(num_groups):
            rows = dy[bounds[g]:bounds[g + 1]].float()
            write(dbias[g], dbias[g] + (rows * scales[bounds[g]:bounds[g + 1], None].float()).sum(0))
            write(dscales[bounds[g]:bounds[g + 1]], dscales[bounds[g]:bounds[g + 1]] + rows @ bias[g].float())
    return dbias, dscales


EMULATED: dict[str, dict[str, Callable]] = {
    "transformer_engine.pytorch.triton.grouped_dbias_dscales": {
        "compute_grouped_dbias": compute_grouped_dbias,
        "compute_grouped_dbias_dscales": compute_grouped_dbias_dscales,
    },
}
