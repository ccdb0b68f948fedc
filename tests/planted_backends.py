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


class LeansOnePercent(_Planted):
    """Scales the largest trainable weight's gradient by 1.01, in any model: every element within its dtype's
    rounding in bf16, all leaning the same way (issue 25)."""

    name = "planted_leans_1pct"

    def prepare(self, model, spec):
        trained = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("weight")]
        if trained:  # a case training no weight has nothing to lean
            max(trained, key=torch.Tensor.numel).register_hook(lambda g: g * 1.01)
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


class OutputInOtherDtype(_Planted):
    """Returns eager's output upcast to fp64: every value is eager's and the gradients are exact (the value checks
    compare in fp64), only the dtype differs."""

    name = "planted_output_fp64"

    def prepare(self, model, spec):
        return lambda x: model(x).double()


class GradInOtherDtype(_Planted):
    """Leaves layer 1's weight gradient in fp64: the same values in another dtype than the parameter's."""

    name = "planted_grad_fp64"

    def prepare(self, model, spec):
        def upcast(p: torch.nn.Parameter) -> None:
            p.grad.data = p.grad.data.double()

        model[int(FAULTY_LAYER)].weight.register_post_accumulate_grad_hook(upcast)
        return model


class UnfreezesAfterForward(_Planted):
    """Sets requires_grad on the first frozen weight after each forward: nothing computed changes (the graph was
    built with it frozen), the model is left with another trainable set."""

    name = "planted_unfreezes"

    def prepare(self, model, spec):
        def forward(x):
            out = model(x)
            _first_frozen_weight(model, spec).requires_grad_(True)
            return out

        return forward


class WritesInput(_Planted):
    """Doubles the caller's input in place after the forward, through `.data` (autograd's version counter does not
    see it): with layer 0's weight frozen nothing saved reads it, so no value the run returns changes."""

    name = "planted_writes_input"

    def prepare(self, model, spec):
        def forward(x):
            out = model(x)
            x.data.mul_(2.0)
            return out

        return forward


class WritesCotangent(_Planted):
    """Halves the incoming output gradient in place and passes on twice the result: every gradient is exact, the
    caller's grad_output is left halved."""

    name = "planted_writes_cotangent"

    def prepare(self, model, spec):
        def forward(x):
            out = model(x)
            out.register_hook(lambda g: g.mul_(0.5) * 2.0)
            return out

        return forward


class GrowingCache(_Planted):
    """Keeps a copy of every forward output: a cache that gains an entry per step."""

    name = "planted_growing_cache"

    def prepare(self, model, spec):
        outputs = []

        def forward(x):
            out = model(x)
            outputs.append(out.detach().clone())
            return out

        return forward
