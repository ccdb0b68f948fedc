"""collective_dtypes: every collective ran in the dtype the wrapper's mixed-precision policy says.

Read from the tensor each collective was called with, below the wrapper (distributed.rank.observe records its dtype):
every gradient reduction after forward (all-reduce, reduce-scatter) in the policy's reduce dtype, and, for a wrapper
that shards, every parameter all-gather in forward and backward in its param dtype. A reduction whose payload holds
gradients without names (a flat buffer the wrapper filled by copying) is named by size and order: a wrapper reduces
one unit's gradients per call as backward reaches it, last unit first, so the k-th reduction of an iteration is
matched to the k-th trainable unit from the end whose element count (trainable, or the whole unit for a flat
parameter) it holds, within sharding padding. Nothing judged (no such collective seen) is "not observed".
"""
from __future__ import annotations

from typing import Callable

from te_verify.checks.collectives import AFTER_FORWARD, ELEMENT_SIZE, GRAD_REDUCTIONS, Collective, ParamInfo
from te_verify.checks.verdict import Verdict, not_observed
FORWARD_AND_BACKWARD = ("forward", "backward")


def is_reduction(c: Collective) -> bool:
    """A gradient reduction; an optimizer step's one-element all-reduce (DeepSpeed's overflow flag in uint8, its
    gradient norm in fp64) carries a scalar of the step, not a gradient."""
    scalar = c.phase == "step" and c.nbytes <= ELEMENT_SIZE.get(c.dtype, 8)
    return c.kind in GRAD_REDUCTIONS and c.phase in AFTER_FORWARD and c.nbytes > c.value_bytes and not scalar


def is_param_gather(c: Collective) -> bool:
    return c.kind == "all_gather" and c.phase in FORWARD_AND_BACKWARD


def _units(params: list[ParamInfo]) -> list[tuple[int | None, list[ParamInfo], list[ParamInfo]]]:
    """(unit, its trainable parameters, all its parameters) of every unit that trains, last unit first."""
    keys = sorted({p.unit for p in params if p.trainable}, key=lambda u: -1 if u is None else u, reverse=True)
    return [(u, [p for p in params if p.unit == u and p.trainable], [p for p in params if p.unit == u]) for u in keys]


def _numel(ps: list[ParamInfo]) -> int:
    return sum(p.nbytes // p.element_size for p in ps)


def reduction_names(call: Collective, order: int, params: list[ParamInfo], world_size: int) -> str:
    """What the `order`-th reduction of its iteration carried: its named parameters' gradients, else the trainable
    unit its size and the backward order give, else its element count."""
    named = sorted({x.name for x in call.carries if x.what == "grad"})
    if named:
        return ", ".join(named)
    elements = call.nbytes // ELEMENT_SIZE.get(call.dtype, 1)
    units = _units(params)
    if order < len(units):
        unit, trainable, whole = units[order]
        pad = sum(p.padding_bound(world_size) // p.element_size for p in whole)
        if any(_numel(ps) <= elements <= _numel(ps) + pad for ps in (trainable, whole)):
            return ", ".join(p.name for p in trainable)
    return f"{elements:,} gradient elements of no unit by size"


def collective_dtypes(case_id: str, backend: str, ranks: dict[int, list[Collective]],
                      params_at: Callable[[int], list[ParamInfo]], param_dtype: str, reduce_dtype: str, shards: bool,
                      world_size: int) -> Verdict:
    """Every gradient reduction in `reduce_dtype` and every parameter all-gather in `param_dtype` (torch names,
    "bfloat16"; "" leaves that part unjudged; gathers only where the wrapper `shards`), on every rank;
    `params_at(iteration)`: the parameters as trainable in that iteration (0-based; a freeze schedule changes them)."""
    problems, judged = [], {"reductions": 0, "gathers": 0}
    for rank, calls in sorted(ranks.items()):
        seen: dict[int, int] = {}
        for index, c in enumerate(calls):
            if is_reduction(c):
                order = seen[c.iteration] = seen.get(c.iteration, -1) + 1
                if reduce_dtype:
                    judged["reductions"] += 1
                    if c.dtype != reduce_dtype:
                        problems.append(f"rank {rank}: {c.kind} #{index} in {c.phase} (iteration {c.iteration + 1}) "
                                        f"reduced the gradients of {reduction_names(c, order, params_at(c.iteration), world_size)} "
                                        f"in {c.dtype}, the policy reduces in {reduce_dtype}")
            elif is_param_gather(c) and param_dtype and shards:
                judged["gathers"] += 1
                if c.dtype != param_dtype:
                    names = ", ".join(sorted({x.name for x in c.carries if x.what == "values"})) or "parameters"
                    problems.append(f"rank {rank}: all_gather #{index} in {c.phase} (iteration {c.iteration + 1}) "
                                    f"gathered {names} in {c.dtype}, the policy computes in {param_dtype}")
    figures = {"reductions_dtype_judged": judged["reductions"], "gathers_dtype_judged": judged["gathers"],
               "policy_reduce_dtype": reduce_dtype, "policy_param_dtype": param_dtype}
    if problems:
        return Verdict("collective_dtypes", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    unseen = [what for what, dtype, wanted in (("gradient reduction", reduce_dtype, True),
                                               ("parameter all-gather", param_dtype, shards))
              if dtype and wanted and not judged["reductions" if what.startswith("gradient") else "gathers"]]
    if unseen:
        return not_observed("collective_dtypes", case_id, backend, f"no {' and no '.join(unseen)} was seen on any "
                            "rank, so the policy's dtype for it cannot be judged", figures, blocked_by=None)
    return Verdict("collective_dtypes", True, figures=figures)
