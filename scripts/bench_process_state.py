"""What watching the process state costs a case: te_verify.run.process_state's snapshot (every setting read) and
restore (every setting read again and compared; nothing changed, as in a clean run), timed per setting and in all,
and set against one smoke case (eager on a 2-layer stack, its three watched runs: reference, backend, fp64 truth).
Also how many entries torch's callables hold (te_verify.run.torch_routing: the namespaces compared by identity).

    .venv/bin/python scripts/bench_process_state.py [--repeats N]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

from te_verify.backends.eager import EagerBackend
from te_verify.run import process_state, torch_routing
from te_verify.run.caserun import CaseRun
from te_verify.spec import CaseSpec

SPEC = CaseSpec("bias", (32, 64, 32), (False, True), (True, True), True, (8,), "fp32", 1)
RUNS_PER_CASE = 3  # a torch-lane case watches its reference, its backend and its fp64 truth


def median_ms(work: Callable[[], object], repeats: int) -> float:
    """Median of `repeats` timed calls, after one untimed (first calls, imports)."""
    work()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def watch_ms(repeats: int) -> float:
    """One watched run's own cost: a snapshot, then a restore that finds nothing changed."""
    return median_ms(lambda: process_state.restore(process_state.snapshot()), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per figure (median)")
    args = parser.parse_args()
    before = process_state.snapshot()
    print("| setting | read (ms) | compare (ms) |\n|---|---|---|")
    for setting in process_state.SETTINGS:
        read = median_ms(setting.read, args.repeats)
        compare = median_ms(lambda s=setting: s.left(before[s.name], s.read()), args.repeats)
        print(f"| {setting.name} | {read:.3f} | {compare:.3f} |")
    entries = sum(len(names) for names in torch_routing.callables().namespaces)
    watched = watch_ms(args.repeats)
    case = median_ms(lambda: CaseRun(SPEC, "eager", EagerBackend()).verify(), max(3, args.repeats // 40))
    print(f"\ntorch's callables: {len(torch_routing.NAMESPACES)} namespaces, {entries:,} entries")
    print(f"one watched run (snapshot + restore, nothing changed): {watched:.2f} ms")
    print(f"one smoke case ({SPEC.id}, eager): {case:.0f} ms; its {RUNS_PER_CASE} watched runs "
          f"{RUNS_PER_CASE * watched:.2f} ms ({100 * RUNS_PER_CASE * watched / case:.2f}%)")


if __name__ == "__main__":
    main()
