"""Backends that waste only from the second iteration on (issue 36, item 1), each with a clean twin.

A compiler that recompiles once the parameters change (an optimizer step bumps every trained parameter's version)
and loses its requires_grad specialisation in the new graph: from its first call after a step, the frozen layers'
inputs are saved and their weight gradients computed, then dropped (waste_planted's "discarded_wgrad"). Iteration 1
is as eager's, so a check judged on iteration 1 alone passes it. Its twin recompiles too, to a correct graph written
differently from eager (waste_planted's split-K Linear: each GEMM as two half-K GEMMs)."""
from __future__ import annotations

import torch

from waste_planted import _PlantedLinear, _SplitKLinear
from te_verify.spec import CaseSpec


def stepped(model: torch.nn.Module) -> "callable":
    """Whether any parameter changed in place since now (an optimizer step, or a harness copying parameters in)."""
    versions = {name: p._version for name, p in model.named_parameters()}
    return lambda: any(p._version != versions[name] for name, p in model.named_parameters())


class _Recompiles:
    """Runs each layer through the 'first graph' until the parameters change, then through the 'recompiled' one."""

    lane = "torch"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        changed = stepped(model)

        def run(x: torch.Tensor) -> torch.Tensor:
            layer_fn = self.recompiled if changed() else self.first
            for layer in model:
                x = layer_fn(x, layer)
            return x

        return run

    @staticmethod
    def first(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        return _PlantedLinear.apply(x, layer.weight, layer.bias, frozenset())


class LosesFrozenAfterStep(_Recompiles):
    """From the first call after a step: every frozen layer's input saved and its wgrad computed and dropped."""

    name = "planted_loses_frozen_after_step"

    @staticmethod
    def recompiled(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        return _PlantedLinear.apply(x, layer.weight, layer.bias, frozenset({"discarded_wgrad"}))


class RecompilesCorrectly(_Recompiles):
    """The clean twin: recompiled to split-K GEMMs, the same FLOPs and saves."""

    name = "recompiles_correctly"

    @staticmethod
    def recompiled(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        return _SplitKLinear.apply(x, layer.weight, layer.bias)
