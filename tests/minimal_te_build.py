"""A user's TE build with no more than README's `package.module` minimum (tests): a high-precision `Linear`
(F.linear, its own Parameters), recipes that hold their arguments, an `autocast` that changes nothing, and an
`is_fp8_available` that says no. It has no GroupedLinear, te.ops, main_grad, backward_dw or Format: every TE family
runs the cases this API serves and skips the others naming what is missing (FP8 cases: the build's own reason).
"""
from __future__ import annotations

import contextlib

import torch

FP8_REASON = "this build computes in high precision only"


class Linear(torch.nn.Module):
    """y = x @ weight.T + bias through torch's own linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 params_dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        kw = dict(dtype=params_dtype or torch.get_default_dtype(), device=device)
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **kw))
        self.bias = torch.nn.Parameter(torch.zeros(out_features, **kw)) if bias else None
        torch.nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)


class DelayedScaling:
    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs


class Float8CurrentScaling(DelayedScaling):
    pass


def is_fp8_available(return_reason: bool = False):
    return (False, FP8_REASON) if return_reason else False


@contextlib.contextmanager
def autocast(enabled: bool = True, recipe: object = None, **kwargs: object):
    yield
