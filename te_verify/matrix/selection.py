"""The pr tier chosen, not cut: per family and backend, the cheapest cases that cover every pair of factor values.

A case's factors are what its spec varies (frozen-pattern class, dtype, input grad, replays, warm-up, freeze timing,
freeze schedule, microbatches and their order, input rank, activation recompute, depth, model kind, LoRA targets, frozen stages, TE recipe and module options, distributed options);
widths and seeds are not factors. Within one family x backend, every pair of values of two factors that some
candidate has (and every value, where only one factor varies) must be covered by a chosen case. The choice is
greedy weighted set cover (Chvatal's heuristic: most newly covered pairs per second first), costs from the measured
table `data/pr_costs.json` (`scripts/measure_costs.py REPORT` rewrites it from a pr run; a case it lacks costs the
median of its family x backend). Deterministic: the same cases on every xdist worker and shard. The cases not
chosen run in the nightly tier, whose generators contain the pr specs (tests/test_selection.py holds that).
"""
from __future__ import annotations

import itertools
import json
import statistics
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from te_verify.spec import CaseSpec

COSTS = Path(__file__).resolve().parents[1] / "data" / "pr_costs.json"  # te_verify/data


def mask_class(mask: tuple[bool, ...] | None) -> str:
    """A freeze mask's pattern: none, all, alternating, prefix, suffix, or other-<number frozen>."""
    if mask is None:
        return "absent"
    n, frozen = len(mask), sum(mask)
    if frozen == 0 or frozen == n:
        return "none" if frozen == 0 else "all"
    if all(mask[i] == (i % 2 == 0) for i in range(n)):
        return "alternating"
    if list(mask) == sorted(mask, reverse=True):
        return "prefix"
    if list(mask) == sorted(mask):
        return "suffix"
    return f"other-{frozen}"


def _flat(prefix: str, value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(f"{prefix}.{key}", item).items()}
    return {prefix: json.dumps(value, sort_keys=True)}


def factors(spec: CaseSpec) -> dict[str, str]:
    """The factor values of a case (see the module docstring)."""
    values = {"dtype": spec.dtype, "x_grad": str(spec.input_requires_grad), "replays": str(spec.replays),
              "warmup": str(spec.warmup_steps), "freeze_timing": spec.freeze_timing,
              "input_rank": str(len(spec.batch_shape)), "recompute": spec.recompute}
    if spec.schedule:  # a factor only where set, so existing cases' factors stay
        values["schedule"] = "+".join(f"{k}.{change}" for k, change in spec.schedule)
    values["autocast"] = spec.autocast or "none"
    if spec.microbatches > 1:  # factors only where set, so existing cases' factors stay
        values.update(microbatches=str(spec.microbatches), accumulation=spec.accumulation)
    if spec.model is None:
        values.update(depth=str(len(spec.widths) - 1), frozen=mask_class(spec.weight_frozen),
                      bias=mask_class(spec.bias_frozen), square=str(len(set(spec.widths)) == 1))
    else:
        model = spec.to_dict()["model"]
        values.update({k: v for k, v in _flat("model", model).items()
                       if k.split(".")[1] in ("kind", "blocks", "lora_on", "frozen_blocks", "frozen", "embedding",
                                              "head", "te_base")})
    for part in ("te", "dist"):
        if getattr(spec, part) is not None:
            values.update(_flat(part, spec.to_dict()[part]))
    return values


def required_pairs(cases: list[dict[str, str]]) -> set[tuple]:
    """Every pair of factor values (of factors that vary here) some case has; single values where one varies."""
    varying = sorted(k for k in set().union(*cases) if len({c.get(k) for c in cases}) > 1)
    if len(varying) == 1:
        return {((varying[0], c.get(varying[0])),) for c in cases}
    return {((a, c.get(a)), (b, c.get(b))) for c in cases for a, b in itertools.combinations(varying, 2)}


def _pairs_of(case: dict[str, str], wanted: set[tuple]) -> set[tuple]:
    return {p for p in wanted if all(case.get(k) == v for k, v in p)}


def choose(ids: list[str], specs: list[CaseSpec], costs: list[float]) -> tuple[list[int], int]:
    """Indices of the cases chosen (in their original order) and how many pairs they cover."""
    cases = [factors(spec) for spec in specs]
    wanted = required_pairs(cases) if cases else set()
    covers = [_pairs_of(case, wanted) for case in cases]
    left, chosen = set(wanted), []
    if not wanted and cases:  # nothing varies: one case (the cheapest) stands for the group
        return [min(range(len(cases)), key=lambda i: (costs[i], i))], 0
    while left:
        best = max(range(len(cases)), key=lambda i: (len(covers[i] & left) / max(costs[i], 1e-3), -i))
        chosen.append(best)
        left -= covers[best]
    return sorted(chosen), len(wanted)


def tier_grid(tier: str, grid: list[CaseSpec]) -> list[CaseSpec]:
    """A generator's grid for `tier`: nightly all of it, pr its pairwise cover at unit cost (the plugin's own cover,
    weighted by measured cost, then runs what it needs of it), smoke none."""
    if tier == "smoke" or not grid:
        return []
    return grid if tier == "nightly" else [grid[i] for i in choose([s.id for s in grid], grid, [1.0] * len(grid))[0]]


@lru_cache(maxsize=1)
def measured_costs() -> dict[str, float]:
    """"family/backend/case id" -> seconds, from the committed table ({} when absent)."""
    return json.loads(COSTS.read_text()) if COSTS.exists() else {}


def cost_key(family: str, backend: str, case_id: str) -> str:
    return f"{family}/{backend}/{case_id}"


def select_pr(family: str, backend: str, specs: list[CaseSpec]) -> tuple[list[CaseSpec], dict[str, Any]]:
    """The pr tier's cases of one family x backend, and what the choice keeps (candidates, chosen, pairs, the
    chosen cases' measured seconds)."""
    table = measured_costs()
    keys = [cost_key(s.family, backend, s.id) for s in specs]  # rows name a case's family by its spec
    known = [table[k] for k in keys if k in table]
    default = statistics.median(known) if known else 1.0
    costs = [table.get(k, default) for k in keys]
    chosen, pairs = choose([s.id for s in specs], specs, costs)
    return [specs[i] for i in chosen], {"candidates": len(specs), "chosen": len(chosen), "pairs": pairs,
                                        "seconds": round(sum(costs[i] for i in chosen), 2)}


def write_costs(rows: Iterable[dict], path: Path = COSTS) -> int:
    """The cost table from a run's rows (each case's measured duration); returns how many entries it holds."""
    table = {cost_key(r["family"], r["backend"], r["case_id"]): round(r["duration"], 3)
             for r in rows if r.get("duration") and r.get("spec")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    return len(table)
