"""How far the case's other summation orders widen the fp32 truth bound (docs/tolerances.md, "An ill-conditioned chain").

For every fp32 stack spec of a tier (torch lane, no microbatches): eager, its fp64 truth and the ORDERS permuted runs
(run.summation_orders), each following eager; per tensor the bound's relative floor with and without the orders.
Prints, per tier, how many tensors the orders widen, the widest floor in unit roundoffs and its distance below a 1%
error, and the specs whose floor the orders raise the most.

    .venv/bin/python scripts/measure_summation_orders.py [--tier nightly] [--top 10]
"""
from __future__ import annotations

import argparse
import statistics

from te_verify.backends.eager import EagerBackend
from te_verify.checks.tolerances import UNIT_ROUNDOFF, truth_bound
from te_verify.matrix.stacks import FAMILIES
from te_verify.oracle.required import compute_dtype
from te_verify.run.runner import run_case, run_fp64_eager
from te_verify.run.summation_orders import other_order_runs


def floors_of(spec) -> list[float]:
    """Each truth tensor's relative floor with the case's other orders, in fp32 unit roundoffs."""
    ref = run_case(spec, EagerBackend())
    truth = run_fp64_eager(spec, follow=ref)
    bound = truth_bound(spec, truth, other_order_runs(spec, lambda sums: run_case(spec, sums, follow=ref)))
    return [max(bound.floor, spread) / UNIT_ROUNDOFF["fp32"] for spread in bound.spread.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", default="nightly")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    specs = {s.id: s for family, make in FAMILIES.items() if family != "accumulation" for s in make(args.tier)
             if s.model is None and s.te is None and s.dist is None and compute_dtype(s) == "fp32"}
    widest = {}
    tensors = widened = 0
    for spec in specs.values():
        floors = floors_of(spec) or [8.0]
        tensors += len(floors)
        widened += sum(f > 8 for f in floors)
        widest[spec.id] = max(floors)
    one_percent = 0.01 / UNIT_ROUNDOFF["fp32"]
    top = max(widest.values())
    print(f"{args.tier}: {len(specs)} fp32 stack specs, {tensors:,} truth tensors; the orders raise the floor past "
          f"8 u on {widened:,}; per spec the widest floor: median {statistics.median(widest.values()):.1f} u, "
          f"largest {top:.1f} u ({one_percent / top:,.0f} times below a 1% error)")
    for case_id, floor in sorted(widest.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {floor:10.1f} u  {case_id}")


if __name__ == "__main__":
    main()
