"""Probe overhead on the pr tier's torch-lane stacks: time probed / time unprobed, per backend (markdown table).

What the two ratios mean (both are medians over the cases; every 4th pr spec of every torch-lane family,
all of them with --all):
- step: one `run_prepared` call (te_verify/run/runner.py) on a callable that is already prepared and, for the
  compilers, already compiled: the forward, the spec's backward passes and the harness's snapshots of output
  and grads; the probed arm also enters the default probes, switches their phases, leaves them and reads
  their figures and observations. That is everything probing adds to a case, so the ratio is what probing
  costs the part of a case it watches. Grads are cleared before every call (outside the timer) so each call
  starts like a case's own run. Probed and unprobed calls alternate on the same callable, REPEATS of each;
  the case's ratio is median(probed) / median(unprobed).
  Cases the backend fails (known gaps, xfails in the suite) are left out; the cases column says how many ran.
- case: `run_case` end to end (build the seeded model, prepare/compile, then as above), probed vs unprobed,
  CASE_REPEATS alternating runs each. Compilation dominates it for thunder and torch_compile.
One probed and one unprobed call run first, untimed, so one-off costs (imports, first compile) are left out.
Torch runs with one intra-op thread (--threads to change): these ops are too small to parallelise, and on a
shared machine the OpenMP pool's waits for a descheduled worker stall single steps for 100+ ms in both arms.
--widths W --batch B reruns the same specs with every width set to W and the batch to B, to show whether
the overhead is per op (a Python dispatch hook per aten op: it shrinks as ops get bigger) or per FLOP.

Usage: .venv/bin/python scripts/bench_probes.py [--all] [--widths W --batch B] [backend ...]
       (default backends: eager thunder torch_compile)
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from te_verify.backends.registry import resolve_backend
from te_verify.matrix.stacks import FAMILIES
from te_verify.models import build_model, make_inputs
from te_verify.probes import default_probes
from te_verify.record import Record
from te_verify.run.runner import prepare_frozen, run_case, run_prepared
from te_verify.spec import CaseSpec

REPEATS = 15  # timed run_prepared calls per arm and case
CASE_REPEATS = 2  # timed run_case calls per arm and case


def _probes(backend, probed: bool) -> list:
    return default_probes(backend.name) if probed else []


def case_ratio(spec: CaseSpec, backend) -> float:
    times: dict[bool, list[float]] = {True: [], False: []}
    for probed in (True, False):  # untimed: imports and first-use costs
        run_case(spec, backend, _probes(backend, probed))
    for _ in range(CASE_REPEATS):
        for probed in (True, False):
            start = time.perf_counter()
            run_case(spec, backend, _probes(backend, probed))
            times[probed].append(time.perf_counter() - start)
    return statistics.median(times[True]) / statistics.median(times[False])


def step_ratio(spec: CaseSpec, backend) -> float | None:
    """None when the backend fails the case (a known gap, e.g. an xfail): nothing comparable to time."""
    model, inputs = build_model(spec), make_inputs(spec)
    fn = prepare_frozen(backend, model, spec)
    times: dict[bool, list[float]] = {True: [], False: []}
    for repeat in range(REPEATS + 1):
        for probed in (True, False):
            model.zero_grad(set_to_none=True)
            inputs.x.grad = None
            probes = _probes(backend, probed)
            start = time.perf_counter()
            record = run_prepared(fn, model, inputs, spec, Record(backend.name), probes)
            elapsed = time.perf_counter() - start
            if record.error is not None:
                return None
            if repeat:  # repeat 0 compiles and warms up
                times[probed].append(elapsed)
    return statistics.median(times[True]) / statistics.median(times[False])


def bench_specs(every: int, width: int | None, batch: int | None) -> list[CaseSpec]:
    specs = [s for family in FAMILIES.values() for s in family("pr")][::every]
    if width is None:
        return specs
    return [dataclasses.replace(s, widths=(width,) * len(s.widths), batch_shape=s.batch_shape[:-1] + (batch,))
            for s in specs]


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backends", nargs="*", default=["eager", "thunder", "torch_compile"])
    parser.add_argument("--all", action="store_true", help="every pr spec (default: every 4th)")
    parser.add_argument("--widths", type=int, help="set every width of every spec to this")
    parser.add_argument("--batch", type=int, help="set the last batch dim of every spec to this (with --widths)")
    parser.add_argument("--no-case", action="store_true", help="skip the end-to-end run_case timing")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if (args.widths is None) != (args.batch is None):
        parser.error("--widths and --batch go together")
    specs = bench_specs(1 if args.all else 4, args.widths, args.batch)
    print("| backend | cases | step probed/unprobed: median (min-max) | case probed/unprobed: median (min-max) |")
    print("| --- | --- | --- | --- |")
    for name in args.backends:
        backend = resolve_backend(name)
        timed = [(s, r) for s in specs if (r := step_ratio(s, backend)) is not None]
        case = "not run" if args.no_case else _spread([case_ratio(s, backend) for s, _ in timed])
        print(f"| {name} | {len(timed)} of {len(specs)} | {_spread([r for _, r in timed])} | {case} |", flush=True)


if __name__ == "__main__":
    main()
