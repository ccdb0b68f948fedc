"""TE builds with one planted fault each in FP8 scaling state, and a backend wrong from its third call.

The TE faults sit where a build would have them: in the delayed-scaling update kernel below TE's Python (tex's
fused_amax_and_scale_update_after_reduction) and in TE's Linear's use of is_first_microbatch. Each is a context
manager patching the booted TE for one run.
"""
from __future__ import annotations

import contextlib

import torch

from planting import loaded_tex, patched

from te_verify.te import api as te_api


def history_never_updated() -> contextlib.AbstractContextManager:
    """The update kernel does nothing: the amax history never rolls and every scale stays 1."""
    return patched(loaded_tex(), "fused_amax_and_scale_update_after_reduction", lambda original: lambda *args: None)


def scale_times(factor: float) -> contextlib.AbstractContextManager:
    """The update kernel leaves every scale `factor` times the recipe's (values saturate at the format's max)."""
    def wrap(original):
        def update(buffer, histories, scales, *rest):
            original(buffer, histories, scales, *rest)
            for scale in scales:
                scale.mul_(factor)
        return update
    return patched(loaded_tex(), "fused_amax_and_scale_update_after_reduction", wrap)


def stale_weight_copy() -> contextlib.AbstractContextManager:
    """TE's Linear makes its FP8 weight copy on the first call with is_first_microbatch=True and never again: later
    steps compute with the weight as it was before the optimizer moved it."""
    linear = te_api.active().api.Linear

    def wrap(original):
        def forward(self, inp, is_first_microbatch=None, *args, **kwargs):
            if is_first_microbatch and getattr(self, "planted_copy_made", False):
                is_first_microbatch = False
            if is_first_microbatch:
                self.planted_copy_made = True
            return original(self, inp, is_first_microbatch, *args, **kwargs)
        return forward
    return patched(linear, "forward", wrap)


class WrongFromThirdCall:
    """Eager, but from its third call on layer 1's weight gradient is 1% off: right through the first two
    iterations (a warm-up-only check would pass it)."""

    name = "planted_wrong_from_third_call"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model, spec):
        weight, calls, handles = model[1].weight, [0], []

        def run(x: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            while handles:
                handles.pop().remove()
            if calls[0] >= 3 and weight.requires_grad:
                handles.append(weight.register_hook(lambda g: g * 1.01))
            return model(x)

        return run
