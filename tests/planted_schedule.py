"""Backends for freeze schedules (CaseSpec.schedule): one built for the requires_grad flags in force when it was
prepared and reused after they change (torch.compile's reused graph, pytorch/pytorch#139476), and its clean twin
that reads them at every call. Both run the model through torch.func.functional_call, not as eager does."""
from __future__ import annotations

import torch
from torch.func import functional_call


class _Functional:
    """Calls the model with every parameter that does not train detached from the graph."""

    name = "functional"

    def available(self) -> tuple[bool, str]:
        return True, ""

    @staticmethod
    def call(model: torch.nn.Module, trains: set[str], x: torch.Tensor) -> torch.Tensor:
        params = {n: (p if n in trains else p.detach()) for n, p in model.named_parameters()}
        return functional_call(model, params, (x,))


class StaleRequiresGrad(_Functional):
    """Reads which parameters need a gradient once, at prepare: a parameter unfrozen later gets none, one frozen
    later still gets one."""

    name = "planted_stale_requires_grad"

    def prepare(self, model, spec):
        trains = {n for n, p in model.named_parameters() if p.requires_grad}
        return lambda x: self.call(model, trains, x)


class RereadsRequiresGrad(_Functional):
    """The clean twin: reads requires_grad at every call."""

    name = "rereads_requires_grad"

    def prepare(self, model, spec):
        return lambda x: self.call(model, {n for n, p in model.named_parameters() if p.requires_grad}, x)
