"""torchrun entry: `torchrun --nproc-per-node N -m te_verify.distributed [--tier pr] [--report-dir DIR] [--device D]`.

Runs the same in-rank case runner inside the ranks torchrun made, on one node or several: each rank on GPU
LOCAL_RANK of its node (nccl) or on the CPU (gloo). Rank 0 gathers every rank's outcome, applies the
distributed checks and alone writes the report (results.json rows, schema_version 1); a case that failed on
some ranks names each of them with its error. Cases of another world size are rows skipped with the reason.
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import torch.distributed as dist

from te_verify import device as run_device
from te_verify.distributed.case_runner import DistCase, run_dist_case
from te_verify.distributed.pool import PoolResult, backend_for
from te_verify.distributed.verify import dist_verdicts
from te_verify.matrix_dist import FAMILIES


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m te_verify.distributed")
    parser.add_argument("--tier", default="pr", choices=("smoke", "pr", "nightly"))
    parser.add_argument("--report-dir", default=None, help="rank 0 writes results.json here")
    parser.add_argument("--family", action="append", default=[], choices=sorted(FAMILIES))
    parser.add_argument("--device", default=None, help="cpu (gloo) or cuda (nccl, GPU LOCAL_RANK per rank); "
                                                      "default: cuda when available")
    return parser.parse_args(argv)


def run_one(spec, rank: int, world: int) -> tuple[object, str | None, float]:
    began = time.perf_counter()
    try:
        return run_dist_case(rank, world, DistCase(spec)), None, time.perf_counter() - began
    except Exception:  # a rank's failure becomes its case's verdict, as in the pool
        return None, traceback.format_exc(), time.perf_counter() - began


def _row(spec, outcome: str, reason: str, duration: float, figures: dict) -> dict:
    return {"nodeid": f"torchrun::{spec.dist.wrapper}-{spec.id}", "case_id": spec.id, "family": spec.family,
            "backend": spec.dist.wrapper, "outcome": outcome, "reason": reason, "duration": duration,
            "figures": figures, "spec": spec.to_dict(), "expectation": None, "worker": "torchrun",
            "device": str(run_device.active())}


def row(spec, result: PoolResult, duration: float) -> dict:
    """The case's row from every rank's outcome; a failure names each rank that failed and how."""
    verdicts = dist_verdicts(spec, result)
    figures = {k: v for verdict in verdicts for k, v in verdict.figures.items()}
    failed = [v.message for v in verdicts if not v.ok]
    return _row(spec, "failed" if failed else "passed", "\n".join(failed), duration, figures)


def skipped_row(spec, world: int) -> dict:
    return _row(spec, "skipped", f"world size {spec.dist.world_size}: this torchrun world has {world} ranks", 0.0, {})


def start(choice: str | None) -> tuple[int, int]:
    """Join torchrun's process group on this rank's device; (rank, world size)."""
    device = run_device.use(run_device.torchrun_device(choice, int(os.environ.get("LOCAL_RANK", "0"))))
    dist.init_process_group(backend_for(device.type))
    return dist.get_rank(), dist.get_world_size()


def gather_case(spec, rank: int, world: int) -> dict | None:
    """Run `spec` on every rank; rank 0 gets its row, the others None."""
    outcome, error, duration = run_one(spec, rank, world)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object((outcome, error), gathered, dst=0)
    if rank != 0:
        return None
    errors = {r: e for r, (_, e) in enumerate(gathered) if e}
    return row(spec, PoolResult([o for o, _ in gathered], errors, 0.0, duration), duration)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        rank, world = start(args.device)
    except run_device.DeviceError as exc:
        print(f"te_verify.distributed: {exc}", file=sys.stderr)
        return 2
    started = datetime.datetime.now(datetime.timezone.utc).isoformat()
    places = [None] * world
    dist.all_gather_object(places, f"{socket.gethostname()}/{run_device.active()}")
    rows = []
    for family in args.family or sorted(FAMILIES):
        for spec in FAMILIES[family](args.tier):
            if spec.dist.world_size != world:
                rows.append(skipped_row(spec, world))
                continue
            case_row = gather_case(spec, rank, world)
            if case_row is not None:
                rows.append(case_row)
    if rank == 0:
        write(args, rows, started, places)
    return 0


def write(args: argparse.Namespace, rows: list[dict], started: str, places: list[str]) -> None:
    from te_verify import compat, environment
    from te_verify.report.writer import write_report

    failed = sum(r["outcome"] == "failed" for r in rows)
    print(f"te_verify.distributed: {len(rows)} cases, {failed} failed")
    if not args.report_dir:
        return
    header = {"run_id": f"torchrun-{os.getpid()}", "started": started,
              "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(), "tier": args.tier,
              "argv": sys.argv, "versions": environment.versions(), "device": environment.device(),
              "devices": places, "shard": None,
              "te_impl": {"name": "-", "why": "distributed lane uses torch.nn.Linear"}, "compat": list(compat.APPLIED),
              "backends": {}}
    path = write_report(Path(args.report_dir), {"schema_version": 1, "header": header, "rows": rows})
    print(f"te_verify.distributed: wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
