"""Planted-fault TE backends for activation recompute in the TE lane: te_eager's stack of TE Linears with each block
(models.recompute.regions) under the hand-written checkpoint of planted_recompute (an autograd.Function that keeps
the block's input and reruns the block in backward), correct or with one fault switched on. The TE modules, their
GEMMs and their saved tensors are TE's own Python over the active --te-impl.

- HandTECheckpoint(): the clean twin, a checkpoint written differently from torch's and TE's.
- HandTECheckpoint("frozen_wgrad"): the recompute makes every weight of the block require grad and asks for all their
  gradients, throwing the frozen ones' away: TE's Linear runs a wgrad GEMM per frozen weight.
- HandTECheckpoint("hoard"): the forward keeps every activation of the block besides its input (no memory saved),
  and backward recomputes all the same.
- HandTECheckpoint("fp8_autocast"): the block enters TE's autocast itself (as a user wrapping autocast inside a
  checkpoint does), so its recompute in backward quantizes with the scales as updated since the forward, and the
  autocast's exit there updates the delayed-scaling state a second time.
"""
from __future__ import annotations

import torch

from planted_recompute import _Checkpoint
from te_verify.backends.te_eager import TEEagerBackend, TEStack
from te_verify.spec import CaseSpec


class _InAutocast(torch.nn.Module):
    """A block of layers run inside TE's autocast with `recipe` (the "fp8_autocast" fault)."""

    def __init__(self, layers: list[torch.nn.Module], api, recipe) -> None:
        super().__init__()
        self.layers, self.api, self.recipe = torch.nn.ModuleList(layers), api, recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.api.autocast(enabled=True, recipe=self.recipe):
            for layer in self.layers:
                x = layer(x)
        return x


class _HandStack(TEStack):
    """TEStack whose blocks run under the hand-written checkpoint with `fault`."""

    fault = ""

    def _run_block(self, layers: list[torch.nn.Module], rows: torch.Tensor, flag: bool | None) -> torch.Tensor:
        params = [p for layer in layers for p in layer.parameters()]
        if self.fault == "fp8_autocast":
            layers = [_InAutocast(layers, self.api, self.recipe)]
        return _Checkpoint.apply(layers, self.fault, rows, *params)


class HandTECheckpoint(TEEagerBackend):
    """te_eager with the hand-written checkpoint around each block of TE modules, with `fault` ("" for none)."""

    def __init__(self, fault: str = "") -> None:
        super().__init__()
        self.fault = fault
        self.name = "hand_te_checkpoint" + (f"_{fault}" if fault else "")

    def prepare(self, model: torch.nn.Module, spec: CaseSpec) -> TEStack:
        stack = super().prepare(model, spec.replace(recompute="none"))
        hand = _HandStack(list(stack.layers), stack.kind, stack.api, stack.recipe, spec.recompute)
        hand.fault = self.fault
        return hand
