"""A planted TE build for the TE lane under torch.autocast (te_autocast): te_verify.te.reference's API, whose `Linear`
keeps its bf16 weight cast for backward wherever a backward runs, also where no dgrad reads it (a frozen first layer
under an input that needs no gradient, whose trained bias still gives it a backward): a saved cast copy of a frozen
weight. It is what TE 2.20's `_Linear` does (linear.py:589 cast, :739 `wt_save = weightmat`), planted in the reference,
which otherwise keeps exactly the casts backward reads (its clean twin). Used as `--te-impl planted_te_autocast`."""
from __future__ import annotations

import torch

from te_verify.te.reference import (DelayedScaling, Float8CurrentScaling, Format, GroupedLinear,  # noqa: F401
                                    autocast, fp8_autocast, is_fp8_available)
from te_verify.te.reference import Linear as ReferenceLinear
from te_verify.te.reference.functional import linear_forward
from te_verify.te.reference.linear import _LinearFunction


class _KeepsWeightCast(_LinearFunction):
    """The reference's Linear function, its forward keeping the weight (its bf16 cast under autocast) as if dgrad
    needed it; backward computes only what autograd asks (no extra GEMM: only the saved bytes are wrong)."""

    @staticmethod
    def forward(ctx, x, weight, bias, module):
        needs = module.grad_needs(ctx.needs_input_grad[:3])
        out, saved = linear_forward(module.state, x, weight, bias, needs[1], True)
        ctx.save_for_backward(*saved)
        ctx.module, ctx.needs = module, needs
        return out


class Linear(ReferenceLinear):
    """te.reference's Linear through _KeepsWeightCast."""

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        self.state.label = self.name
        self.state.first_microbatch = is_first_microbatch
        return _KeepsWeightCast.apply(inp, self.weight, self.bias, self)
