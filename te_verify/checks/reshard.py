"""Reshard timing and gathered-parameter peak, from the timeline of gathered bytes per layer during backward.

Boundary k is the input of layer k (boundary n is the model output). The timeline holds, at backward start,
at every "grad_done k" (the gradient of boundary k is complete, i.e. layer k finished its dgrad and the
wrapper ran whatever it runs there) and at backward end, the bytes of gathered parameter storage per layer.
A frozen layer that was gathered for backward must hold no gathered storage at its own "grad_done" event
(seed 004: resharding at the end of backward passes a hook-count test but holds the memory all along).
"""
from __future__ import annotations

from dataclasses import dataclass

from te_verify.checks.verdict import Verdict, not_observed, waste_ratio

Event = tuple[str, int, list[int]]


@dataclass(frozen=True)
class LayerInfo:
    """What the checks need to know about one layer."""

    # Full parameter bytes of the layer.
    nbytes: int
    # Does any of its parameters require grad at backward?
    trainable: bool
    # Does its input need a gradient (dgrad needed)?
    input_needs_grad: bool
    # Does backward run its forward again (activation recompute: a checkpointed block whose backward runs)?
    recomputed: bool = False
    # The element count of each of its parameters, in registration order (a flattening wrapper's layout pads them).
    numels: tuple[int, ...] = ()

    @property
    def needed_in_backward(self) -> bool:
        return self.trainable or self.input_needs_grad or self.recomputed


def _first(events: list[Event], name: str, boundary: int) -> int | None:
    return next((i for i, (e, b, _) in enumerate(events) if e == name and b == boundary), None)


def reshard_timing(case_id: str, backend: str, events: list[Event], layers: list[LayerInfo],
                   shards: bool) -> Verdict:
    """Every frozen layer whose dgrad runs is resharded by its own grad_done event."""
    head = f"[{case_id}] backend {backend}"
    if not shards:
        return Verdict("reshard_timing", True, figures={"reshard_compared": "nothing sharded: no gathers to time"})
    if not events:
        return not_observed("reshard_timing", case_id, backend, "the wrapper shards parameters but gives no "
                            "gathered_bytes probe (Wrapped.gathered_bytes), so no timeline", blocked_by=None)
    late, checked, never = [], 0, 0
    for k, layer in enumerate(layers):
        if layer.trainable or not layer.input_needs_grad:
            continue
        done = _first(events, "grad_done", k)
        if done is None:
            late.append(f"layer {k}: no grad_done event for its input although it needs a gradient")
            continue
        if not any(ev[2][k] for ev in events[:done + 1]):
            never += 1  # seen gathered at no event up to its grad_done (a persistent parameter: never sharded)
            continue
        checked += 1
        held = events[done][2][k]
        if held:
            freed = next((f"{e}({b})" for e, b, g in events[done + 1:] if not g[k]), "never")
            late.append(f"frozen layer {k}: still holds {held} B of gathered parameters after its input gradient "
                        f"was done (grad_done({k})); resharded only at {freed}")
    figures = {"reshard_compared": "frozen layers' gathered bytes at their grad_done", "reshard_events": len(events),
               "reshard_frozen_layers_checked": checked, "reshard_frozen_layers_never_gathered": never,
               "reshard_late_layers": len(late)}
    if late:
        return Verdict("reshard_timing", False, f"{head}: " + "; ".join(late), figures)
    return Verdict("reshard_timing", True, figures=figures)


def required_gathered_peak(layers: list[LayerInfo], reshard_after_forward: bool) -> int:
    """Least gathered bytes alive at once in backward: without reshard-after-forward every layer is still
    gathered when backward starts (the mode's contract); with it, the layer computing plus one prefetched."""
    if not reshard_after_forward:
        return sum(layer.nbytes for layer in layers)
    needed = [layer.nbytes for layer in reversed(layers) if layer.needed_in_backward]
    if len(needed) < 2:
        return sum(needed)
    return max(a + b for a, b in zip(needed, needed[1:]))


def gathered_peak(case_id: str, backend: str, events: list[Event], layers: list[LayerInfo],
                  reshard_after_forward: bool, shards: bool) -> Verdict:
    """Peak gathered bytes during backward vs the required figure."""
    if not shards:
        return Verdict("gathered_peak", True, figures={"gathered_peak_compared": "nothing sharded: no gathers"})
    if not events:
        return not_observed("gathered_peak", case_id, backend, "the wrapper shards parameters but gives no "
                            "gathered_bytes probe (Wrapped.gathered_bytes), so no timeline", blocked_by=None)
    actual = max(sum(gathered) for _, _, gathered in events)
    required = required_gathered_peak(layers, reshard_after_forward) if actual else 0
    figures = {"gathered_peak_compared": "the largest gathered bytes", "gathered_peak_events": len(events),
               "peak_gathered_bytes_actual": actual, "peak_gathered_bytes_required": required,
               "peak_gathered_bytes_ratio": waste_ratio(actual, required)}
    if actual > required:
        at = max(events, key=lambda ev: sum(ev[2]))
        return Verdict("gathered_peak", False, f"[{case_id}] backend {backend}: {actual} B of gathered parameters "
                       f"alive at {at[0]}({at[1]}) (per layer {at[2]}), required at most {required} B", figures)
    return Verdict("gathered_peak", True, figures=figures)
