"""torchrun entry: `torchrun --nproc-per-node N -m te_verify.distributed [--tier pr] [--report-dir DIR]`.

Runs the same in-rank case runner inside the ranks torchrun made; rank 0 gathers every rank's outcome,
applies the distributed checks and writes results.json rows (schema_version 1).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import traceback
from pathlib import Path

import torch.distributed as dist

from te_verify.distributed.case_runner import DistCase, run_dist_case
from te_verify.distributed.pool import PoolResult, default_backend
from te_verify.distributed.verify import dist_verdicts
from te_verify.matrix_dist import FAMILIES


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m te_verify.distributed")
    parser.add_argument("--tier", default="pr", choices=("smoke", "pr", "nightly"))
    parser.add_argument("--report-dir", default=None, help="rank 0 writes results.json here")
    parser.add_argument("--family", action="append", default=[], choices=sorted(FAMILIES))
    return parser.parse_args(argv)


def run_one(spec, rank: int, world: int) -> tuple[object, str | None, float]:
    began = time.perf_counter()
    try:
        return run_dist_case(rank, world, DistCase(spec)), None, time.perf_counter() - began
    except Exception:  # a rank's failure becomes its case's verdict, as in the pool
        return None, traceback.format_exc(), time.perf_counter() - began


def row(spec, result: PoolResult, duration: float) -> dict:
    verdicts = dist_verdicts(spec, result)
    figures = {k: v for verdict in verdicts for k, v in verdict.figures.items()}
    failed = [v.message for v in verdicts if not v.ok]
    return {"nodeid": f"torchrun::{spec.dist.wrapper}-{spec.id}", "case_id": spec.id, "family": spec.family,
            "backend": spec.dist.wrapper, "outcome": "failed" if failed else "passed", "reason": "\n".join(failed),
            "duration": duration, "figures": figures, "spec": spec.to_dict(), "expectation": None, "worker": "torchrun"}


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    dist.init_process_group(default_backend())
    rank, world = dist.get_rank(), dist.get_world_size()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat()
    rows = []
    for family in args.family or sorted(FAMILIES):
        for spec in FAMILIES[family](args.tier):
            if spec.dist.world_size != world:
                continue
            outcome, error, duration = run_one(spec, rank, world)
            gathered = [None] * world if rank == 0 else None
            dist.gather_object((outcome, error), gathered, dst=0)
            if rank == 0:
                errors = {r: e for r, (_, e) in enumerate(gathered) if e}
                rows.append(row(spec, PoolResult([o for o, _ in gathered], errors, 0.0, duration), duration))
    if rank == 0:
        write(args, rows, started)
    return 0


def write(args: argparse.Namespace, rows: list[dict], started: str) -> None:
    from te_verify import compat, environment
    from te_verify.report.writer import write_report

    failed = sum(r["outcome"] == "failed" for r in rows)
    print(f"te_verify.distributed: {len(rows)} cases, {failed} failed")
    if not args.report_dir:
        return
    header = {"run_id": f"torchrun-{os.getpid()}", "started": started,
              "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(), "tier": args.tier,
              "argv": sys.argv, "versions": environment.versions(), "device": environment.device(),
              "te_impl": {"name": "-", "why": "distributed lane uses torch.nn.Linear"}, "compat": list(compat.APPLIED),
              "backends": {}}
    path = write_report(Path(args.report_dir), {"schema_version": 1, "header": header, "rows": rows})
    print(f"te_verify.distributed: wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
