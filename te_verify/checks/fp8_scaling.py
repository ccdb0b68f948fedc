"""fp8_scaling: every FP8 quantization of every iteration used the scale its recipe defines, and the scaling state TE
keeps equals the recipe's after every optimizer step; the FP8 weight copy is made when is_first_microbatch says.

The recipes' definitions, computed here from the amaxes measured at the tex boundary (probes.fp8_scaling), not by
calling TE (TE's recipe docs: transformer_engine/common/recipe/__init__.py; the update kernel
common/recipe/delayed_scaling.cu; the scale rule common/recipe/recipe_common.cuh):
- DelayedScaling: a slot starts with scale 1 and an amax history of L zeros. A quantization uses the slot's current
  scale and adds its amax to the history's first entry. When the interval ends (the forward's autocast region exits
  for forward tensors, a backward ends for gradients) a slot that saw a non-zero amax rolls its history (the new
  amax enters, the oldest of L leaves, the first entry is cleared) and takes scale = (fp8_max / 2^margin) / amax,
  amax the history's max ("max") or the new amax ("most_recent"); an amax of 0, inf or NaN keeps the scale, an
  infinite scale becomes fp32's max. A slot that saw nothing keeps history and scale.
- Float8CurrentScaling: each quantization's scale is fp8_max / amax of the tensor itself (amax raised to the
  recipe's epsilon; 1 where amax is 0, inf or NaN; fp32's max for an infinite scale; rounded down to a power of 2
  where the recipe says so).
- fp8_max is the recipe's format's for the tensor's direction: E4M3 (448) forward, and backward too in the E4M3
  format, E5M2 (57344) for gradients in HYBRID.
- TE's activation recompute (te.distributed.checkpoint): a forward tensor quantized again in backward uses the scale
  the same iteration's forward used and adds nothing to the history (TE stashes and restores the scaling state).
- One state per site: DelayedScaling keeps a module's state for the whole training, so a GEMM site (weight and
  operand role, probes.fp8_sites) whose quantizations move to a new state that starts over fails (fp8_site_state).
- The weight copy: with is_first_microbatch passed (the microbatch families), each weight is quantized exactly once
  per iteration, on its first microbatch (after the optimizer step moved it); otherwise once per forward call.
Amax histories are compared exactly (an amax is a max: no rounding). Scales are compared within SCALE_ULPS units in
the last place of fp32: TE's update kernel divides (fp8_max / amax, one rounding), thunder's TE executor gets the same
scale one ulp away (a multiplication by a reciprocal rounds twice), and a quantization's scale is read back as
1 / scale_inv (one more rounding). A 64x scale, a history that never rolls, a stale weight copy are all far from it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from te_verify.checks.fp8_site_state import check_site_states
from te_verify.checks.verdict import Verdict, not_observed
from te_verify.probes.fp8_scaling import CURRENT, DELAYED, Quantization
from te_verify.record import Record
from te_verify.spec import TE_RECOMPUTE_MODES

FP8_MAX = {"E4M3": 448.0, "E5M2": 57344.0}
FLOAT32_MAX = torch.finfo(torch.float32).max
SCALE_ULPS = 4  # see the module docstring
HOST = torch.device("cpu")  # the check's own arithmetic, whatever torch's default device is


def scales_agree(have: float, want: float) -> bool:
    """Within SCALE_ULPS fp32 units in the last place of `want` (exact for 1.0 and the special values)."""
    if have == want:
        return True
    return abs(have - want) <= SCALE_ULPS * torch.finfo(torch.float32).eps * abs(want)


@dataclass(frozen=True)
class RecipeParams:
    """What the case's recipe defines (te_api.make_recipe leaves TE's defaults but for format and history)."""

    # "delayed" or "current".
    kind: str
    # Format of forward tensors and of gradients: "E4M3"/"E4M3" or, for HYBRID, "E4M3"/"E5M2".
    forward_format: str
    backward_format: str
    # DelayedScaling: history length, "max" or "most_recent", margin.
    history_len: int = 1024
    algo: str = "max"
    margin: int = 0
    # Float8CurrentScaling: power-of-2 scales and the amax floor.
    power_2: bool = False
    epsilon: float = 0.0


def recipe_params(spec) -> RecipeParams:
    te = spec.te
    backward = "E5M2" if te.fp8_format == "HYBRID" else "E4M3"
    return RecipeParams(te.recipe, "E4M3", backward, te.amax_history_len)


def f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32, device=HOST))


def delayed_scale(amax: float, scale: float, fp8_max: float, margin: int) -> float:
    """The scale after an update whose chosen amax is `amax` (keeps `scale` where no scale can be made)."""
    scaled_max = f32(f32(fp8_max) * f32(2.0 ** -margin))
    if not (amax > 0 and amax != float("inf")):
        return scale
    new = float(torch.tensor(scaled_max, dtype=torch.float32, device=HOST) / torch.tensor(amax, dtype=torch.float32, device=HOST))
    return FLOAT32_MAX if new == float("inf") else new


def current_scale(amax: float, fp8_max: float, power_2: bool, epsilon: float) -> float:
    """Float8CurrentScaling's scale of a tensor whose amax is `amax`."""
    amax = max(f32(amax), f32(epsilon)) if amax == amax else amax
    if amax == 0 or amax != amax or amax == float("inf"):
        return 1.0
    scale = torch.tensor(fp8_max, dtype=torch.float32, device=HOST) / torch.tensor(amax, dtype=torch.float32, device=HOST)
    if torch.isinf(scale):
        scale = torch.tensor(FLOAT32_MAX, dtype=torch.float32, device=HOST)
    if power_2:
        scale = (scale.view(torch.int32) & int(0xFF800000 - (1 << 32))).view(torch.float32)
    return float(scale)


@dataclass
class SlotModel:
    """A delayed-scaling slot as the recipe defines it."""

    history: list[float]
    scale: float = 1.0

    def update(self, amax: float, params: RecipeParams, fp8_max: float) -> None:
        """The end of an interval in which the slot saw `amax` (0: it saw nothing)."""
        if amax == 0:
            return
        window = self.history[1:] + [amax]
        chosen = max((0.0 if v != v else v) for v in window) if params.algo == "max" else amax
        self.history = [0.0] + window[1:]
        self.scale = delayed_scale(chosen, self.scale, fp8_max, params.margin)


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    compared: int = 0


def _used_ok(q: Quantization, scale: float) -> bool:
    """Whether the quantization used `scale` (its 1/scale_inv, scales_agree)."""
    return scales_agree(q.scale_used, scale)


def _fp8_max(params: RecipeParams, direction: str) -> float:
    """The format's max for tensors of `direction` ("forward" or "backward")."""
    return FP8_MAX[params.forward_format if direction == "forward" else params.backward_format]


def update_interval(q: Quantization, direction: str) -> int:
    """The call of `direction` whose end updates the slot `q` quantized into: the one it ran in, or, for a call of
    the other direction, the next one (its amax waits in the history's first entry until then)."""
    forward, backward = q.calls
    done = forward if direction == "forward" else backward
    return done if q.interval[0] == direction else done + 1


def _check_delayed(slot: tuple, qs: list[Quantization], states: list[dict], params: RecipeParams, name: str,
                   found: Findings, recompute: bool = False) -> SlotModel:
    """The slot's quantizations and states against the recipe's model of it; returns the model at its end."""
    model = SlotModel([0.0] * params.history_len)
    after_step: dict[int, tuple[list[float], float]] = {}
    by_interval: dict[int, list[Quantization]] = {}
    direction = qs[0].interval[0]  # a slot belongs to the direction it is first quantized in
    # TE's activation recompute (`recompute`: the case checkpoints with TE's checkpoint) reruns the forward in backward
    # with the scales its forward used (quantization.py: copy_forward_fp8_meta_tensors_for_recompute before the
    # forward, get_old_fp8_meta_tensors_for_recompute in the recompute), and restores the updated state after it
    # (restore_fp8_meta_tensors): such a quantization adds no amax to the history and must use the forward's scale.
    rerun = [q for q in qs if recompute and direction == "forward" and q.interval[0] == "backward"]
    rerun_ids, forward_scale = {id(q) for q in rerun}, {}
    for q in qs:
        if id(q) not in rerun_ids:
            by_interval.setdefault(update_interval(q, direction), []).append(q)
    for group in by_interval.values():
        for q in group:
            found.compared += 1
            forward_scale[q.iteration] = model.scale
            if not _used_ok(q, model.scale):
                found.problems.append(f"{name}, iteration {q.iteration} ({q.interval[0]} call {q.interval[1]}): "
                                      f"quantized with scale {q.scale_used:.9g}, the recipe's is {model.scale:.9g}")
        model.update(max(q.amax for q in group), params, _fp8_max(params, direction))
        after_step[group[-1].iteration] = (list(model.history), model.scale)
    for q in rerun:
        found.compared += 1
        want = forward_scale.get(q.iteration)
        if want is None or not _used_ok(q, want):
            found.problems.append(f"{name}, iteration {q.iteration} (recompute in backward call {q.interval[1]}): "
                                  f"quantized with scale {q.scale_used:.9g}, the forward's was {want}")
    _check_states(slot, states, after_step, name, found)
    return model


def _check_states(slot: tuple, states: list[dict], after: dict[int, tuple[list[float], float]], name: str,
                  found: Findings) -> None:
    """TE's state of the slot after each step against the model's after that step's intervals."""
    last = None
    for k, state in enumerate(states, start=1):
        last = after.get(k, last)
        if slot not in state or last is None:
            continue
        history, scale = state[slot]
        want_history, want_scale = last
        found.compared += 1
        if not scales_agree(f32(scale), f32(want_scale)):
            found.problems.append(f"{name}, after step {k}: scale {scale:.9g}, the recipe's is {want_scale:.9g}")
        elif [f32(v) for v in history] != [f32(v) for v in want_history]:
            shown = lambda h: [round(v, 6) for v in h if v][-4:]  # the newest non-zero entries
            found.problems.append(f"{name}, after step {k}: amax history {shown(history)} (newest last), the "
                                  f"recipe's is {shown(want_history)}")


def _check_current(qs: list[Quantization], params: RecipeParams, names: dict, directions: dict,
                   found: Findings) -> None:
    for q in qs:
        found.compared += 1
        want = current_scale(q.amax, _fp8_max(params, directions[q.slot]), params.power_2, params.epsilon)
        if not _used_ok(q, want):
            found.problems.append(f"{names.get(q.slot, 'a current-scaling quantizer')}, iteration {q.iteration} "
                                  f"({q.interval[0]} call {q.interval[1]}): quantized with scale {q.scale_used:.6g}, "
                                  f"the recipe's for amax {q.amax:.6g} is {want:.6g}")


def _check_formats(qs: list[Quantization], params: RecipeParams, directions: dict, found: Findings) -> None:
    wrong = Counter((directions[q.slot], q.fp8_max) for q in qs if q.fp8_max != _fp8_max(params, directions[q.slot]))
    for (direction, fp8_max), n in sorted(wrong.items()):
        found.problems.append(f"{n} quantization(s) of {direction} tensors to a format of max {fp8_max:g}, the "
                              f"recipe's is {_fp8_max(params, direction):g}")


def _check_weight_copies(qs: list[Quantization], microbatches: int, first_flag: bool, forward_calls: int,
                         iterations: int, uses: dict[str, int], found: Findings) -> None:
    """Each use of a weight (a tied weight has several) quantizes it once per iteration with is_first_microbatch, else
    once per forward call."""
    per = Counter((q.source, q.iteration) for q in qs if q.source is not None and q.interval[0] == "forward")
    calls = 1 if first_flag else max(1, forward_calls // max(iterations, 1))
    for weight in sorted({w for w, _ in per}):
        want = calls * uses.get(weight, 1)
        for k in range(1, iterations + 1):
            found.compared += 1
            have = per.get((weight, k), 0)
            if have != want:
                why = ("is_first_microbatch=True on the first microbatch makes a fresh copy after the optimizer "
                       "step, False reuses it" if first_flag else "every forward call quantizes it")
                found.problems.append(f"weight {weight}: quantized {have} time(s) in iteration {k}, expected {want} "
                                      f"({why}; {microbatches} microbatch(es))")


def fp8_scaling(case_id: str, backend: str, spec, got: Record) -> Verdict:
    """The run's quantizations and scaling state against the recipe (module docstring), from the observer's
    observations (probes.fp8_scaling); not observed where none reached the tex boundary."""
    seen = got.observations.get("fp8_scaling")
    first_flag = bool(got.observations.get("is_first_microbatch"))
    if seen is None or not seen["quantizations"]:
        why = "no quantization reached the tex boundary" if seen is not None else "no FP8 scaling observer ran"
        return not_observed("fp8_scaling", case_id, backend, why + (" (the run raised: ending says how)"
                                                                    if got.error is not None else ""),
                            blocked_by="ending" if got.error is not None else None)
    params, names, found = recipe_params(spec), seen.get("slot_names", {}), Findings()
    qs: list[Quantization] = seen["quantizations"]
    directions: dict[tuple, str] = {}
    for q in qs:  # a quantizer's tensors are of the direction it is first used in
        directions.setdefault(q.slot, q.interval[0])
    _check_formats(qs, params, directions, found)
    slots: dict[tuple, list[Quantization]] = {}
    for q in qs:
        slots.setdefault((q.kind, q.slot), []).append(q)
    finals = {slot: _check_delayed(slot, group, seen["states"], params,
                                   names.get(slot, f"delayed-scaling slot {slot[1]}"), found,
                                   spec.recompute in TE_RECOMPUTE_MODES)
              for (kind, slot), group in slots.items() if kind == DELAYED}
    site_figures = check_site_states(qs, finals, scales_agree, found.problems)
    _check_current([q for q in qs if q.kind == CURRENT], params, names, directions, found)
    _check_weight_copies(qs, spec.te.microbatches, first_flag, seen["forward_calls"], len(seen["states"]) or 1,
                         seen.get("weight_uses", {}), found)
    figures = {"fp8_quantizations_compared": len(qs), "fp8_scaling_values_compared": found.compared,
               "fp8_states_compared": len(seen["states"]), **site_figures}
    if found.problems:
        return Verdict("fp8_scaling", False, f"[{case_id}] backend {backend}: FP8 scaling differs from the "
                       f"{spec.te.recipe} recipe's: " + "; ".join(found.problems[:8])
                       + (f"; and {len(found.problems) - 8} more" if len(found.problems) > 8 else ""), figures,
                       tuple(found.problems))
    return Verdict("fp8_scaling", True, figures=figures)
