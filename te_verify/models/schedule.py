"""Freeze schedules (CaseSpec.schedule): the trainable set of a linear stack in force at each iteration, and the
change applied before an iteration, to a backend's model and to its reference the same way.

Iteration 1 trains what the spec's freeze_timing leaves trainable (spec.frozen_after_prepare); before iteration k a
change named at k (spec.SCHEDULE_CHANGES) replaces the masks, each from the spec alone, so every lane and every
reference computes the same sets without looking at a model.
"""
from __future__ import annotations

from typing import Iterable

import torch

from te_verify.models.seeded import TORCH_DTYPES
from te_verify.models.stack import set_frozen
from te_verify.spec import CaseSpec

Masks = tuple[tuple[bool, ...], tuple[bool, ...] | None]  # (weight frozen, bias frozen) per layer


def _changed(change: str, masks: Masks) -> Masks:
    """The masks after `change`, given those in force before it."""
    weights, biases = masks
    n = len(weights)
    if change == "unfreeze_all":
        new = (False,) * n
        return new, (new if biases is not None else None)
    if change == "freeze_all_but_last":
        new = (True,) * (n - 1) + (False,)
        return new, (new if biases is not None else None)
    if change == "swap":
        return tuple(not f for f in weights), (tuple(not f for f in biases) if biases is not None else None)
    if change == "bias_only":
        return (True,) * n, (False,) * n
    raise ValueError(f"unknown schedule change {change!r}")


def masks_at(spec: CaseSpec, iteration: int) -> Masks:
    """The (weight, bias) freeze masks in force during `iteration` (1-based)."""
    masks = spec.frozen_after_prepare()
    for k, change in spec.schedule:
        if k <= iteration:
            masks = _changed(change, masks)
    return masks


def change_at(spec: CaseSpec, iteration: int) -> str | None:
    """The change the schedule makes before `iteration`, or None."""
    return dict(spec.schedule).get(iteration)


def apply_schedule(layers: Iterable[torch.nn.Module], spec: CaseSpec, iteration: int) -> bool:
    """Before `iteration`: set the stack's layers (a built model, or the layers a wrapper runs) to the masks in
    force then, where the schedule changes them; whether it did."""
    if change_at(spec, iteration) is None:
        return False
    set_frozen(layers, *masks_at(spec, iteration))
    return True


def new_state_bytes(spec: CaseSpec, iteration: int) -> int:
    """Bytes of optimizer state (SGD's momentum, one element per parameter element, in the parameter's dtype) the step
    of `iteration` makes for the first time: the parameters trainable then and in no iteration before it (none
    without a schedule: the first step made every state; model families take no schedule)."""
    if not spec.schedule:
        return 0
    size = torch.empty((), dtype=TORCH_DTYPES[spec.dtype]).element_size()
    shapes = [(spec.widths[i] * spec.widths[i + 1], spec.widths[i + 1]) for i in range(spec.n_layers)]
    total = 0
    for i, (weight, bias) in enumerate(shapes):
        for kind, elements in ((0, weight), (1, bias)):
            trains = [masks_at(spec, k)[kind] is not None and not masks_at(spec, k)[kind][i]
                      for k in range(1, iteration + 1)]
            total += elements * size if trains[-1] and not any(trains[:-1]) else 0
    return total
