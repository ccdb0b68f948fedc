"""The intra-op threads of a run's worker processes: the machine's cores shared out among the xdist workers.

torch's intra-op pool has one thread per core in every process, so N workers on C cores run N x C threads, and each
OpenMP parallel region then waits for threads the scheduler has parked: 270 matmuls of a TE case's size (16x128 by
128x64) took 6.8 s in a process beside two busy ones on this 2-core machine, 2.3 ms with one thread (measured
2026-11-30; docs/performance.md). Each worker takes C // N threads, at least one, unless the user set OMP_NUM_THREADS
(then torch's own default stands: theirs to choose, e.g. two runs sharing a machine)."""
from __future__ import annotations

import os

import torch


def threads_per_worker(workers: int, cores: int) -> int:
    """The cores each of `workers` processes gets (at least one)."""
    return max(1, cores // max(1, workers))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def share_cores(is_worker: bool) -> int | None:
    """In an xdist worker, set torch's intra-op threads to this worker's share; the count set, or None if left alone."""
    if not is_worker or "OMP_NUM_THREADS" in os.environ:
        return None
    threads = threads_per_worker(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), _cores())
    torch.set_num_threads(threads)
    return threads


def describe(workers: int) -> str:
    """The report header's words for what the workers of a run of `workers` get."""
    if "OMP_NUM_THREADS" in os.environ:
        return f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} (the user's)"
    if workers < 1:
        return f"torch's default ({torch.get_num_threads()}) in this process"
    return f"{threads_per_worker(workers, _cores())} per worker ({_cores()} cores, {workers} workers)"
