"""examples/user_engine.py with one planted fault: a weight decay that reaches the frozen parameters too (each step
multiplies them by 0.99). Gradients and communication stay exact; only the parameters the step leaves are wrong, so
params_after_steps must fail naming each frozen parameter."""
from __future__ import annotations

import torch
from torch import nn

from examples.user_engine import FlatAllReduceSGD
from te_verify.api import CaseSpec, Wrapped


class DecayingFlatAllReduceSGD(FlatAllReduceSGD):
    name = "decaying_flat_allreduce_sgd"

    def wrap(self, model: nn.Module, spec: CaseSpec) -> Wrapped:
        wrapped = super().wrap(model, spec)
        frozen, step = [p for p in model.parameters() if not p.requires_grad], wrapped.train.step

        def decaying_step() -> None:
            step()
            with torch.no_grad():
                for p in frozen:
                    p.mul_(0.99)

        wrapped.train.step = decaying_step
        return wrapped
