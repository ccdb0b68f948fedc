"""fp8_scaling's part on delayed-scaling sites: the recipe keeps one scaling state per module for the whole training
(DelayedScaling's RecipeState in the module's fp8_meta; TE rebuilds it only by inheriting the old buffers,
RecipeState.inherit_state_from), so a site's quantizations that move to a new state which starts over (scale 1,
an empty amax history) while the recipe's state of that site has a history restart delayed scaling mid-training.

A site is a GEMM's weight and operand role (probes.fp8_sites). A slot (scaling-state storage, index) of a site is
retired when the site's later quantizations no longer use it; a slot first used after another was retired takes
its place. A site's first slot starts fresh wherever it first appears: TE creates both fp8_meta states at a module's
first forward with scale 1 and empty histories, and a backward state no backward used (a layer frozen until then)
is still so when its first backward runs. Two slots in use together (a tied weight's modules) are not a move.
"""
from __future__ import annotations

from typing import Callable, Protocol

from te_verify.probes.fp8_scaling import DELAYED, Quantization


class SiteModel(Protocol):
    """The recipe's model of a slot at its end (checks.fp8_scaling.SlotModel)."""

    history: list[float]
    scale: float


def _shown(history: list[float]) -> list[float]:
    """The newest non-zero entries of a history, newest last."""
    return [round(v, 6) for v in history if v][-4:]


def _moves(qs: list[tuple[int, Quantization]]) -> list[tuple[tuple, Quantization]]:
    """(retired slot, first quantization of the slot that took its place) for one site's quantizations (run order)."""
    first: dict[tuple, int] = {}
    last: dict[tuple, int] = {}
    for n, q in qs:
        first.setdefault(q.slot, n)
        last[q.slot] = n
    moves = []
    for slot, start in first.items():
        retired = [s for s in first if s != slot and last[s] < start]
        if retired:
            old = max(retired, key=last.__getitem__)
            moves.append((old, next(q for n, q in qs if n == start)))
    return moves


def check_site_states(qs: list[Quantization], finals: dict[tuple, SiteModel], agree: Callable[[float, float], bool],
                      problems: list[str]) -> dict:
    """Each site's move to a new slot against the recipe's one state per site; appends to `problems`, returns the
    figures (the sites judged, and the delayed quantizations whose site was not observed). `agree(have, want)`
    compares scales as the check does."""
    by_site: dict[str, list[tuple[int, Quantization]]] = {}
    unattributed = 0
    for n, q in enumerate(qs):
        if q.kind != DELAYED:
            continue
        if q.site is None:
            unattributed += 1
            continue
        by_site.setdefault(q.site, []).append((n, q))
    for site, group in by_site.items():
        for old_slot, q in _moves(group):
            old = finals.get(old_slot)
            kept = old is not None and (any(old.history) or old.scale != 1.0)
            # A new slot starting elsewhere than at 1 fails the slot's own model (checks.fp8_scaling).
            if kept and agree(q.scale_used, 1.0) and not agree(q.scale_used, old.scale):
                problems.append(f"{site}: from iteration {q.iteration} ({q.interval[0]} call {q.interval[1]}) "
                                f"quantized by a new delayed-scaling state that starts over (scale "
                                f"{q.scale_used:.9g}, amax history empty) where the recipe keeps the site's state: "
                                f"scale {old.scale:.9g}, amax history {_shown(old.history)} (newest last)")
    if not by_site and not unattributed:
        return {}  # no delayed scaling in the run
    figures = {"fp8_delayed_sites": len(by_site), "fp8_delayed_quantizations_without_site": unattributed}
    if not by_site and unattributed:
        figures["fp8_site_states"] = "not observed: no delayed-scaling quantization was read by a GEMM of a weight seen quantized"
    return figures
