"""The global FP8 state: `autocast` (TE >= 2.9 spelling) and `fp8_autocast` (older spelling).

Delayed-scaling scales of forward tensors are updated when the outermost autocast region exits, as TE
does in `reduce_and_update_fp8_tensors(forward=True)`; gradient scalers update after each layer's backward.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

from te_verify.te.reference.fp8 import TensorScaler
from te_verify.te.reference.recipe import DelayedScaling, Recipe


@dataclass
class FP8GlobalState:
    """What the active autocast region says (the reference's FP8GlobalStateManager)."""

    # Is FP8 compute on?
    enabled: bool = False
    # The recipe of the innermost region (None outside any region).
    recipe: Recipe | None = None
    # Nesting depth of autocast regions.
    depth: int = 0
    # Forward scalers used inside the current region, updated when the outermost region exits.
    pending: list[TensorScaler] = field(default_factory=list)


STATE = FP8GlobalState()


def is_fp8_enabled() -> bool:
    return STATE.enabled


def get_fp8_recipe() -> Recipe:
    """The active recipe, or TE's default (DelayedScaling()) outside a region."""
    return STATE.recipe if STATE.recipe is not None else DelayedScaling()


def note_forward_scaler(scaler: TensorScaler) -> None:
    if all(s is not scaler for s in STATE.pending):
        STATE.pending.append(scaler)


@contextlib.contextmanager
def autocast(enabled: bool = True, calibrating: bool = False, recipe: Recipe | None = None,
             amax_reduction_group: object = None) -> Iterator[None]:
    """TE >= 2.9's `te.autocast`: FP8 compute with `recipe` (default DelayedScaling()) inside the block."""
    saved = (STATE.enabled, STATE.recipe)
    STATE.enabled, STATE.recipe = enabled, (recipe or DelayedScaling()) if enabled else STATE.recipe
    STATE.depth += 1
    try:
        yield
    finally:
        STATE.depth -= 1
        STATE.enabled, STATE.recipe = saved
        if STATE.depth == 0:
            for scaler in STATE.pending:
                scaler.update()
            STATE.pending.clear()


def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Recipe | None = None,
                 fp8_group: object = None) -> contextlib.AbstractContextManager:
    """The pre-2.9 spelling of `autocast`."""
    return autocast(enabled=enabled, calibrating=calibrating, recipe=fp8_recipe, amax_reduction_group=fp8_group)


class FP8GlobalStateManager:
    """TE's name for the holder of the global FP8 state; `reset()` as TE's (te_verify.run.isolation, before every case)."""

    @staticmethod
    def reset() -> None:
        STATE.__init__()  # in place: whoever holds STATE sees the reset
