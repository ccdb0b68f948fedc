"""Step-time ratio probed/unprobed on the pr tier's torch-lane stacks, per backend; prints a markdown table.

Two figures per backend: the whole case (build, prepare/compile, forward, backward passes: what the suite
pays per case) and the steady-state step (forward + backward on an already-compiled callable).
Usage: .venv/bin/python scripts/bench_probes.py [backend ...]   (default: eager thunder torch_compile)
"""
from __future__ import annotations

import statistics
import sys
import time

from te_verify.backends.registry import resolve_backend
from te_verify.matrix import FAMILIES
from te_verify.models import build_model, make_inputs
from te_verify.probes import default_probes
from te_verify.record import Record
from te_verify.runner import prepare_frozen, run_case, run_prepared

STEPS = 20  # steady-state steps per case and arm


def case_seconds(spec, backend, probed: bool) -> float:
    start = time.perf_counter()
    run_case(spec, backend, default_probes(backend.name) if probed else ())
    return time.perf_counter() - start


def step_seconds(spec, backend, probed: bool) -> float:
    model, inputs = build_model(spec), make_inputs(spec)
    fn = prepare_frozen(backend, model, spec)
    run_prepared(fn, model, inputs, spec, Record(backend.name))  # compile outside the timing
    start = time.perf_counter()
    for _ in range(STEPS):
        run_prepared(fn, model, inputs, spec, Record(backend.name), default_probes(backend.name) if probed else ())
    return (time.perf_counter() - start) / STEPS


def ratios(backend_name: str) -> tuple[int, float, float]:
    backend = resolve_backend(backend_name)
    specs = [s for family in FAMILIES.values() for s in family("pr")][::4]  # every 4th case: all stacks, fewer runs
    case = [case_seconds(s, backend, True) / case_seconds(s, backend, False) for s in specs]
    step = [step_seconds(s, backend, True) / step_seconds(s, backend, False) for s in specs]
    return len(specs), statistics.median(case), statistics.median(step)


def main(names: list[str]) -> None:
    print("| backend | cases | case time probed/unprobed (median) | step time probed/unprobed (median) |")
    print("| --- | --- | --- | --- |")
    for name in names:
        n, case, step = ratios(name)
        print(f"| {name} | {n} | {case:.2f}x | {step:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["eager", "thunder", "torch_compile"])
