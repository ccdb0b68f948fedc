"""Backends with one planted fault each: the checks must catch every one, with the right message.

Each wraps eager PyTorch and adds hooks; they are also usable as external backends
(`--backend tests.planted_backends:OffByOnePercent`).
"""
from __future__ import annotations

import torch

from te_verify.spec import CaseSpec

FAULTY_LAYER = "1"  # the layer the gradient faults touch


def _first_frozen_weight(model: torch.nn.Module, spec: CaseSpec) -> torch.nn.Parameter:
    frozen, _ = spec.frozen_after_prepare()
    return model[frozen.index(True)].weight


class _Planted:
    name = "planted"

    def available(self) -> tuple[bool, str]:
        return True, ""


class OffByOnePercent(_Planted):
    """Scales layer 1's weight gradient by 1.01."""

    name = "planted_off_by_1pct"

    def prepare(self, model, spec):
        weight = model[int(FAULTY_LAYER)].weight
        if weight.requires_grad:
            weight.register_hook(lambda g: g * 1.01)
        return model


class GradForFrozen(_Planted):
    """Leaves a gradient on the first frozen weight (a wgrad computed and kept for a frozen weight)."""

    name = "planted_grad_for_frozen"

    def prepare(self, model, spec):
        def forward(x):
            out = model(x)
            weight = _first_frozen_weight(model, spec)
            out.register_hook(lambda g: setattr(weight, "grad", torch.zeros_like(weight)))
            return out

        return forward


class DropsGrad(_Planted):
    """Drops the gradient of layer 1's weight after it was accumulated."""

    name = "planted_drops_grad"

    def prepare(self, model, spec):
        model[int(FAULTY_LAYER)].weight.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
        return model


class ReplayDiverges(_Planted):
    """Correct on the first backward pass; layer 1's weight gradient is 5% off on every later pass."""

    name = "planted_replay_diverges"

    def prepare(self, model, spec):
        passes = {"n": 0}

        def scale(grad):
            passes["n"] += 1
            return grad if passes["n"] == 1 else grad * 1.05

        model[int(FAULTY_LAYER)].weight.register_hook(scale)
        return model


class RaisesOnReplay(_Planted):
    """Raises on the second backward pass, where eager completes."""

    name = "planted_raises_on_replay"

    def prepare(self, model, spec):
        passes = {"n": 0}

        def forward(x):
            out = model(x)

            def count(grad):
                passes["n"] += 1
                if passes["n"] == 2:
                    raise RuntimeError("planted: saved state already freed")
                return grad

            out.register_hook(count)
            return out

        return forward


class WrongOutput(_Planted):
    """Returns an output 1% off whose gradients are exact: the offset is detached, so with a fixed cotangent no
    gradient changes (what the gradient checks cannot see)."""

    name = "planted_wrong_output"

    def prepare(self, model, spec):
        def forward(x):
            out = model(x)
            return out + 0.01 * out.detach()

        return forward


class WritesFrozenBias(_Planted):
    """Writes into a frozen bias after each forward (a cast cache written back): nothing it returns changes, since
    a bias is not saved for backward."""

    name = "planted_writes_bias"

    def prepare(self, model, spec):
        bias = model[0].bias

        def forward(x):
            out = model(x)
            with torch.no_grad():
                bias.copy_(bias.to(torch.bfloat16).to(bias.dtype))
            return out

        return forward
