"""Benchmark: small matmuls (a TE case's size) in a process whose intra-op threads compete with busy neighbours.

    python scripts/bench_threads.py [--busy 2] [--calls 270]

Starts `--busy` neighbour processes (each a loop of the same matmuls at torch's default thread count, as xdist
workers were before te_verify/run/worker_threads.py), then times `--calls` 16x128 @ 128x64 fp32 matmuls in a fresh
process at 1 thread and at torch's default (one per core). Prints one line per thread count: seconds in all and per
call. The figures in docs/performance.md come from here.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

TIMED = """
import sys, time, torch
threads = int(sys.argv[1])
if threads:
    torch.set_num_threads(threads)
a, b = torch.randn(16, 128), torch.randn(128, 64)
for _ in range(10):
    a @ b
start = time.perf_counter()
for _ in range(int(sys.argv[2])):
    a @ b
print(torch.get_num_threads(), time.perf_counter() - start)
"""
BUSY = """
import torch
a, b = torch.randn(16, 128), torch.randn(128, 64)
while True:
    a @ b
"""


def timed(threads: int, calls: int) -> tuple[int, float]:
    out = subprocess.run([sys.executable, "-c", TIMED, str(threads), str(calls)], capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[0]), float(out[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="neighbour processes at torch's default thread count")
    parser.add_argument("--calls", type=int, default=270, help="timed matmuls")
    args = parser.parse_args()
    neighbours = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    try:
        time.sleep(2)  # the neighbours are running
        for threads in (1, 0):
            count, seconds = timed(threads, args.calls)
            print(f"{count} intra-op thread(s) beside {args.busy} busy process(es): {args.calls} matmuls in "
                  f"{seconds:.4f} s ({seconds / args.calls * 1e3:.3f} ms each)")
    finally:
        for process in neighbours:
            process.kill()
            process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
