"""A planted TE build for FP8 under torch.autocast (te_autocast with a recipe): te_verify.te.reference's API, whose
`Linear` quantizes the autocast's bf16 casts of its input and weight instead of the fp32 tensors (fp32 -> bf16 -> FP8,
two roundings; delayed scaling records the casts' amax). It is what thunder's TE executor does under torch.autocast
(its autocast rule casts a linear's operands before the executor claims it: expectations/thunder_te.toml,
scripts/upstream/thunder_te_autocast_quantizes_bf16_casts.py); TE's modules quantize the fp32 tensors. Used as
`--te-impl planted_te_autocast_fp8`."""
from __future__ import annotations

import torch

from te_verify.te.reference import (DelayedScaling, Float8CurrentScaling, Format, GroupedLinear,  # noqa: F401
                                    autocast, fp8_autocast, is_fp8_available)
from te_verify.te.reference import Linear as ReferenceLinear
from te_verify.te.reference.autocast import is_fp8_enabled
from te_verify.te.reference.functional import autocast_dtype
from te_verify.te.reference.linear import _LinearFunction


class _QuantizesCasts(_LinearFunction):
    """The reference's Linear function, fed the autocast's casts of its input and weight under an FP8 recipe."""

    @staticmethod
    def forward(ctx, x, weight, bias, module):
        act = autocast_dtype(x)
        if act is not None and is_fp8_enabled():
            x, weight = x.to(act), weight.to(act)
        return _LinearFunction.forward(ctx, x, weight, bias, module)


class Linear(ReferenceLinear):
    """te.reference's Linear through _QuantizesCasts."""

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        self.state.label = self.name
        self.state.first_microbatch = is_first_microbatch
        return _QuantizesCasts.apply(inp, self.weight, self.bias, self)
