"""Rank-side recompute under DDP (the pool's `wrap=`): the stack's blocks (models.recompute.regions) under the
hand-written checkpoint of planted_recompute, correct or computing the frozen weights' wgrad in its recompute, in
place of the model's torch checkpoint. Module-level functions: the pool pickles them by name."""
from __future__ import annotations

import torch

from planted_recompute import _Checkpoint
from te_verify.distributed.types import Wrapped
from te_verify.distributed.wrappers.ddp import wrap_ddp
from te_verify.models.recompute import regions


class HandCheckpointedStack(torch.nn.Sequential):
    """The model's layers (the same modules and Parameters), each block under _Checkpoint with `fault`."""

    def __init__(self, layers: list[torch.nn.Module], fault: str) -> None:
        super().__init__(*layers)
        self.fault = fault

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in regions(len(self)):
            layers = [self[i] for i in block]
            x = _Checkpoint.apply(layers, self.fault, x, *(p for layer in layers for p in layer.parameters()))
        return x


def _ddp_with(fault: str, model, spec) -> Wrapped:
    return wrap_ddp(HandCheckpointedStack(list(model), fault), spec)  # the same layers, in the model's order


def ddp_hand_checkpoint(model, spec) -> Wrapped:
    """The clean twin written differently from torch's checkpoint: autograd.grad over the trainable parameters."""
    return _ddp_with("", model, spec)


def ddp_recompute_with_frozen_wgrad(model, spec) -> Wrapped:
    """Its recompute makes every weight of the block require grad and asks autograd.grad for all of them, throwing
    the frozen ones' gradients away: a wgrad GEMM per frozen weight, on every rank."""
    return _ddp_with("frozen_wgrad", model, spec)
