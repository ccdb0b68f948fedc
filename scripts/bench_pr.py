"""Measure a tier: wall time, cases per backend, time per case (overall and the TE lane's), compilations, and the
import time of TE's Python over the tex emulation; from a fresh run's results.json.

    .venv/bin/python scripts/bench_pr.py [--tier pr] [--report-dir DIR] [extra te-verify run args]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def summarise(results: dict, wall: float) -> str:
    rows = results["rows"]
    outcomes = Counter(r["outcome"] for r in rows)
    by_backend = Counter((r["backend"], r["outcome"]) for r in rows)
    compilations = [r["figures"].get("compilations") for r in rows if r["figures"].get("compilations") is not None]
    thunder = [r["figures"]["compilations"] for r in rows
               if r["backend"].startswith("thunder") and "compilations" in r["figures"]]
    durations = [r["duration"] for r in rows if r["outcome"] != "skipped"]
    lines = [
        f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}",
        f"tier {results['header']['tier']}: wall {wall:.0f} s, {len(rows)} cases ({dict(outcomes)})",
        f"time per case: mean {statistics.mean(durations):.3f} s, median {statistics.median(durations):.3f} s "
        f"(per worker; wall/cases = {wall / max(len(rows), 1):.3f} s)",
        f"thunder compilations: {sum(thunder)} over {len(thunder)} thunder cases (max per case {max(thunder, default=0)})",
        f"all compilations: max per case per backend {max(compilations, default=0)}",
        "per backend: " + ", ".join(f"{b} {o} {n}" for (b, o), n in sorted(by_backend.items())),
        te_lane_line(rows),
        where_the_time_goes(rows),
    ]
    return "\n".join(lines)


def where_the_time_goes(rows: list[dict], top: int = 12) -> str:
    """The sum of case durations per (family, backend), largest first: what a faster tier would have to cut."""
    seconds, cases = Counter(), Counter()
    for r in rows:
        seconds[(r["family"], r["backend"])] += r["duration"] or 0.0
        cases[(r["family"], r["backend"])] += 1
    total = sum(seconds.values())
    parts = [f"{family}/{backend} {s:.0f} s for {cases[(family, backend)]}"
             for (family, backend), s in seconds.most_common(top)]
    thunder = sum(s for (_, backend), s in seconds.items() if backend.startswith("thunder"))
    return (f"sum of case durations {total:.0f} s, {thunder:.0f} s of it on thunder's backends; largest: "
            + ", ".join(parts))


def te_lane_line(rows: list[dict]) -> str:
    """Time per TE-lane case that ran (passed or a known gap), per backend."""
    te = [r for r in rows if r["family"].startswith("te_") and r["outcome"] in ("passed", "xfailed")]
    parts = []
    for backend in sorted({r["backend"] for r in te}):
        d = [r["duration"] for r in te if r["backend"] == backend]
        parts.append(f"{backend} {len(d)} cases, median {statistics.median(d):.3f} s, mean {statistics.mean(d):.3f} s")
    return "TE lane per case: " + "; ".join(parts)


def te_import_seconds(repeats: int = 3) -> float:
    """Median wall time of booting TE's Python over the emulation in a fresh interpreter (torch already imported)."""
    code = ("import time, torch; t = time.perf_counter(); from te_verify.te import tecpu; tecpu.boot(); "
            "print(time.perf_counter() - t)")
    runs = [float(subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", code], capture_output=True, text=True,
                                 check=True).stdout.strip().splitlines()[-1]) for _ in range(repeats)]
    return statistics.median(runs)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tier", default="pr")
    parser.add_argument("--report-dir", default=str(ROOT / "reports" / "bench"))
    args, extra = parser.parse_known_args()
    start = time.monotonic()
    code = subprocess.call([str(ROOT / ".venv" / "bin" / "te-verify"), "run", "--tier", args.tier,
                            "--report-dir", args.report_dir, *extra])
    wall = time.monotonic() - start
    results = json.loads((Path(args.report_dir) / "results.json").read_text())
    print(summarise(results, wall))
    print(f"TE import (TE 2.20.2 Python over the tex emulation, median of 3): {te_import_seconds():.2f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
