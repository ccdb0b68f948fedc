"""Freeze schedules (CaseSpec.schedule): the trainable set in force at each iteration, as the spec of a case that
trains that set from the start (`spec_at`), from which models.apply_schedule sets a backend's model and its
reference the same way before the iteration, and the oracle reads the iteration's required work.

Iteration 1 trains what the spec's freeze_timing leaves trainable (spec.frozen_after_prepare); before iteration k a
change named at k (spec.SCHEDULE_CHANGES) replaces the masks of a linear stack, or a model family's groups of
parameters (models.stages.changed), each from the spec alone, so every lane and every reference computes the same
sets without looking at a model.
"""
from __future__ import annotations

import dataclasses

from te_verify.models import stages
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


def spec_at(spec: CaseSpec, iteration: int) -> CaseSpec:
    """The case as the oracle sees iteration `iteration`: the trainable set in force then (a stack's masks, a model
    family's groups as ModelConfig.trains), set before preparing and never changed (the same spec where the schedule
    changes nothing by then)."""
    if not spec.schedule or all(k > iteration for k, _ in spec.schedule):
        return spec
    if spec.model is not None:
        model = dataclasses.replace(spec.model, trains=stages.trains_at(spec, iteration))
        return spec.replace(model=model, freeze_timing="before", schedule=())
    weights, biases = masks_at(spec, iteration)
    return spec.replace(weight_frozen=weights, bias_frozen=biases, freeze_timing="before", schedule=())
