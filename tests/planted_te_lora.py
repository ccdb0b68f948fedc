"""A planted TE-lane backend for LoRA over TE Linear (issue 12).

`WastedBaseWgradTE` is te_eager with one fault: each adapter's frozen TE base computes with a shadow Parameter on
the frozen weight's storage that requires grad, so TE runs the base's wgrad GEMM and its result lands on the
shadow's .grad, which nothing reads: the model's weight stays frozen with .grad None and every gradient matches
eager. Only the GEMM record shows the waste (as thunder issue 2076's put_grad discards frozen weights' wgrads).

`ClaimingTE` is te_eager quantizing linears beyond the case's TE sites, as thunder's TE executor does, optionally
with a wrong weight scale on one of them.
"""
from __future__ import annotations

import torch

from te_verify.backends.te_eager import TEEagerBackend
from te_verify.models.lora import LoRALinear


class ShadowBase(torch.nn.Linear):
    """The model's frozen weight as its own Parameter (a torch Linear to the probes and the oracle), computed by a
    hidden TE Linear holding a trainable shadow of that weight."""

    def __init__(self, te_linear: torch.nn.Module) -> None:
        super().__init__(te_linear.in_features, te_linear.out_features, bias=False, device="meta")
        self.weight = te_linear.weight
        te_linear.weight = torch.nn.Parameter(te_linear.weight.detach(), requires_grad=True)
        object.__setattr__(self, "_te", te_linear)  # not a submodule: its shadow is no parameter of the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._te(x)


class WastedBaseWgradTE(TEEagerBackend):
    name = "te_eager_wasted_base_wgrad"

    def prepare(self, model: torch.nn.Module, spec):
        fn = super().prepare(model, spec)
        for module in list(model.modules()):
            if isinstance(module, LoRALinear) and not isinstance(module.base, torch.nn.Linear):
                module.base = ShadowBase(module.base)
        return fn


class ClaimingTE(TEEagerBackend):
    """te_eager that also runs `claims` (linears no adapter wraps) as TE Linears, as thunder's TE executor claims
    every linear FP8 accepts; with `wrong_scale_on`, that claimed linear quantizes its weight with 4 times the
    recipe's scale from its second forward on (delayed scaling: the values over a quarter of the amax clip)."""

    name = "te_eager_claiming"

    def __init__(self, claims: tuple[str, ...], wrong_scale_on: str | None = None) -> None:
        super().__init__(claims)
        self.wrong_scale_on = wrong_scale_on

    def prepare(self, model: torch.nn.Module, spec):
        fn = super().prepare(model, spec)
        if self.wrong_scale_on is not None:
            model.get_submodule(self.wrong_scale_on).register_forward_pre_hook(_weight_scale_times_four)
        return fn


def _weight_scale_times_four(module: torch.nn.Module, args) -> None:
    scaling = module.fp8_meta.get("scaling_fwd")  # made by the first forward under autocast
    if scaling is not None:
        scaling.scale[1].mul_(4.0)  # TE's forward meta: 0 input, 1 weight, 2 output
