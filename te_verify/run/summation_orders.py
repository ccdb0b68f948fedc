"""The case's own correct summation orders: eager with every GEMM's sums taken in another (seeded) order.

A stack's gradient is the end of a chain of dependent sums. Where that chain cancels (its magnitudes far above the
result's), any correct order of summation lands tens or hundreds of unit roundoffs from the fp64 truth, and eager's
own distance is one sample of that spread, sometimes a lucky one (docs/tolerances.md, "An ill-conditioned chain"). The
truth bound (checks.tolerances.truth_bound) therefore also reads how far these runs land: each nn.Linear computes
the same product with the reduction axis of each of its three GEMMs permuted (the input features for the forward, the
output features for the input gradient, the rows for the weight and bias gradients), so BLAS adds other pairs in
another order; no value changes but by rounding.

Only fp32 cases run them: in bf16 each GEMM's result is rounded to bf16 (2^-9), which hides the fp32 accumulation's
order, and the bf16 bound's factor over eager is what separates a 1% error there (docs/tolerances.md).
"""
from __future__ import annotations

import types
from typing import Callable

import torch
import torch.nn.functional as F

from te_verify.oracle.required import compute_dtype
from te_verify.record import Record
from te_verify.spec import CaseSpec

# How many other orders a case runs: each is one more eager run of the case (about 6 ms on a pr stack). Eight, since
# the spread of a cancelling chain has a long tail (checks.tolerances.ORDER_MARGIN).
ORDERS = 8


def _inverse(order: torch.Tensor) -> torch.Tensor:
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return inverse


def _permuted_linear(generator: torch.Generator) -> Callable:
    """A forward for an nn.Linear: the same y = x W^T + b, its three GEMMs summing in orders drawn from `generator`
    (new ones each call: a module called twice sums twice differently, as any order may)."""

    def forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        r, p, q = (torch.randperm(n, generator=generator) for n in (rows.shape[0], *self.weight.shape[::-1]))
        bias = self.bias[q] if self.bias is not None else None
        out = F.linear(rows[r][:, p], self.weight[q][:, p], bias)
        return out[_inverse(r)][:, _inverse(q)].reshape(*x.shape[:-1], self.weight.shape[0])

    return forward


class PermutedSums:
    """Eager with every torch.nn.Linear of the model summing in orders seeded by `seed` (the module doc)."""

    def __init__(self, seed: int):
        self.seed = seed
        self.name = f"eager_sums_order_{seed}"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        for index, module in enumerate(m for m in model.modules() if type(m) is torch.nn.Linear):
            generator = torch.Generator().manual_seed(1_000 * self.seed + index)
            module.forward = types.MethodType(_permuted_linear(generator), module)
        return model


def other_order_runs(spec: CaseSpec, run: Callable[[PermutedSums], Record]) -> tuple[Record, ...]:
    """`run` (the case's runner, following eager) over ORDERS seeded PermutedSums, where the case computes in fp32;
    none otherwise. A run that raised is left out: it widens nothing."""
    if compute_dtype(spec) != "fp32":
        return ()
    runs = (run(PermutedSums(seed)) for seed in range(1, ORDERS + 1))
    return tuple(record for record in runs if record.error is None)
