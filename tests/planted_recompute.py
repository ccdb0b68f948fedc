"""Planted-fault backends for activation recompute: a hand-written checkpoint around the stack's blocks
(te_verify.models.recompute.regions), correct or with one fault switched on.

- HandCheckpoint(): a correct checkpoint written differently from torch's: an autograd.Function that runs its block
  under no_grad, keeps its input, and in backward reruns the block and calls autograd.grad for the input (where it
  needs a gradient) and the trainable parameters only. The clean twin.
- HandCheckpoint("frozen_wgrad"): the recompute makes every weight of the block require grad and asks
  autograd.grad for all of them, throwing the frozen ones' gradients away: a wgrad GEMM per frozen weight.
- HandCheckpoint("hoard"): the forward keeps every activation of the block besides its input (no memory saved),
  and backward recomputes all the same.
- NoRecompute(): any family's model (the stack, Llama) with its checkpoint switched off: every activation kept, as
  a backend that drops the user's checkpoint would.
"""
from __future__ import annotations

import torch

from te_verify.models.recompute import regions
from te_verify.spec import CaseSpec


class _Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, layers, fault, x, *params):
        ctx.layers, ctx.fault = layers, fault
        kept = []
        with torch.no_grad():
            out = x
            for layer in layers:
                kept.append(out)
                out = layer(out)
        ctx.save_for_backward(x, *(kept[1:] if fault == "hoard" else ()))
        return out

    @staticmethod
    def backward(ctx, grad):
        x = ctx.saved_tensors[0].detach().requires_grad_(ctx.needs_input_grad[2])
        params = [p for layer in ctx.layers for p in layer.parameters()]
        trainable = [p.requires_grad for p in params]
        if ctx.fault == "frozen_wgrad":
            for p in params:
                p.requires_grad_(True)
        try:
            with torch.enable_grad():
                out = x
                for layer in ctx.layers:
                    out = layer(out)
            wanted = [p for p in params if p.requires_grad]
            inputs = ([x] if x.requires_grad else []) + wanted
            grads = list(torch.autograd.grad(out, inputs, grad)) if inputs else []
        finally:
            for p, flag in zip(params, trainable):
                p.requires_grad_(flag)
        grad_x = grads.pop(0) if x.requires_grad else None
        by_param = dict(zip(map(id, wanted), grads))
        return (None, None, grad_x, *(by_param.get(id(p)) if flag else None for p, flag in zip(params, trainable)))


class HandCheckpoint:
    """The stack with each block under the hand-written checkpoint, with `fault` ("" for none)."""

    lane = "torch"

    def __init__(self, fault: str = "") -> None:
        self.fault = fault
        self.name = "hand_checkpoint" + (f"_{fault}" if fault else "")

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        layers = list(model)
        blocks = [[layers[i] for i in block] for block in regions(len(layers))]
        fault = self.fault

        def run(x: torch.Tensor) -> torch.Tensor:
            for block in blocks:
                x = _Checkpoint.apply(block, fault, x, *(p for layer in block for p in layer.parameters()))
            return x

        return run


class NoRecompute:
    """The model as built, its blocks run without their checkpoint (`recompute` set to "none")."""

    name = "no_recompute"
    lane = "torch"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        model.recompute = "none"
        return model
