"""What the retention probe's settle loop costs on a worker that has kept many objects, with and without freezing
the objects older than the measured step (probes.retention: gc.freeze while Retention is entered).

    .venv/bin/python scripts/bench_retention_gc.py [--objects 2000000 8000000]

The kept objects are lists (gc-tracked; a dict holding only ints is not tracked). Per heap size: the seconds one settle of a step that keeps growing (every look taken: 4 collections and 3 short
waits) takes unfrozen (gc.freeze disabled) and frozen (as the probe runs). Figures go to docs/performance.md with the
machine and commit.
"""
from __future__ import annotations

import argparse
import gc
import time
from unittest import mock

import torch

from te_verify.probes.retention import Retention


def settle_seconds(freeze: bool) -> float:
    """One settle of a step that keeps 4 KiB each time: every look is taken."""
    kept = []
    retention = Retention(enabled=True)
    with mock.patch.object(gc, "freeze", gc.freeze if freeze else (lambda: None)), retention:
        before = retention._live_bytes()
        kept.append(torch.ones(1024))  # made while the probe tracks: growth that never settles
        start = time.perf_counter()
        grown = retention._settled_growth(before)
        seconds = time.perf_counter() - start
    assert grown > 0, "the planted growth was not seen"
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, nargs="+", default=[0, 2_000_000, 8_000_000])
    args = parser.parse_args()
    print("| objects kept by the worker | settle, unfrozen (s) | settle, frozen (s) |")
    print("|---|---|---|")
    for count in args.objects:
        old = [[i] for i in range(count)]  # what a worker keeps from earlier cases: gc-tracked containers
        gc.collect()
        unfrozen = min(settle_seconds(False) for _ in range(3))
        frozen = min(settle_seconds(True) for _ in range(3))
        print(f"| {count:,} | {unfrozen:.3f} | {frozen:.3f} |")
        del old


if __name__ == "__main__":
    main()
