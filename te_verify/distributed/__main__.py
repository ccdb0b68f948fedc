"""torchrun entry: `torchrun --nproc-per-node N -m te_verify.distributed [--tier pr] [--report-dir DIR] [--device D]
[--expectations DIR] [--wrap pkg.module:attr] [--case-timeout SECONDS]`.

Runs the same in-rank case runner inside the ranks torchrun made, on one node or several: each rank on GPU
LOCAL_RANK of its node (nccl) or on the CPU (gloo). Rank 0 gathers every rank's outcome, applies the
distributed checks and the expectations (as the pytest plugin does: a known gap is xfailed, a gap failing
otherwise or passing fails, a skip entry is not run) and alone writes the report (results.json rows,
schema_version 1); a case that failed on some ranks names each of them with its error. Cases of another world
size are rows skipped with the reason. Every rank exits 1 when a case failed unexpectedly (or passed where a gap
is recorded), 2 on bad arguments or a report folder in use by another live run, else 0. A case past its timeout
ends the job (torchrun_end): its row says "timed out after N s", the report is marked incomplete, exit 1.
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
from te_verify import environment
from te_verify.distributed.rank.case_runner import DistCase, run_dist_case
from te_verify.distributed.declare import DeclarationError, DeclaredWrapper, declared_wrapper, load_object
from te_verify.distributed.types import WrapperError
from te_verify.distributed.torchrun_end import CaseTimeout, claim_report_dir
from te_verify.case_timeout import DEFAULT_S
from te_verify.report.lock import ReportLockError
from te_verify.expectations.entries import ExpectationsError, covering, load_expectations, mark_reason, skip_entry
from te_verify.expectations.judge import check_results, judge
from te_verify.distributed.pool.pool import PoolResult, backend_for
from te_verify.distributed.verify import dist_verdicts, rank_peaks
from te_verify.matrix.dist import FAMILIES as WRAPPER_FAMILIES
from te_verify.matrix.engines import FAMILIES as ENGINE_FAMILIES
from te_verify.matrix.dist_recompute import dist_recompute_specs
from te_verify.report.stream import RowStream

ROOT = Path(__file__).resolve().parents[2]
# The wrappers' families, then the training engines' (a user's --wrap runs the wrappers' families only).
# dist_recompute runs wrappers and engines alike (matrix.dist_recompute); a user's --wrap does not run it.
FAMILIES = {**WRAPPER_FAMILIES, **ENGINE_FAMILIES, "dist_recompute": dist_recompute_specs}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m te_verify.distributed")
    parser.add_argument("--tier", default="pr", choices=("smoke", "pr", "nightly"))
    parser.add_argument("--report-dir", default=None, help="rank 0 writes results.json here")
    parser.add_argument("--family", action="append", default=[], choices=sorted(FAMILIES))
    parser.add_argument("--device", default=None, help="cpu (gloo) or cuda (nccl, GPU LOCAL_RANK per rank); "
                                                      "default: cuda when available")
    parser.add_argument("--expectations", default=str(ROOT / "expectations"), help="known gaps (default: the suite's)")
    parser.add_argument("--wrap", default=None, help="package.module:attr of your wrapper's declaration: its "
                                                    "families' cases run under its name (README, 'Your own wrapper')")
    parser.add_argument("--case-timeout", type=float, default=None, metavar="SECONDS",
                        help="seconds a case may run before the job ends with its row 'timed out' (default: the "
                             "tier's distributed default; 0: none)")
    return parser.parse_args(argv)


def load_wrap(path: str | None) -> DeclaredWrapper | None:
    """The --wrap declaration, or None; a bad path or an object that declares no wrapper raises WrapperError
    naming it."""
    if path is None:
        return None
    try:
        declared = declared_wrapper(path)
    except DeclarationError as exc:
        raise WrapperError(f"--wrap {exc}") from None
    if declared is None:
        try:
            load_object(path)
        except DeclarationError as exc:
            raise WrapperError(f"--wrap {exc}") from None
        raise WrapperError(f"--wrap {path!r}: not a wrapper declaration (name, wrap, shards; README, 'Your own "
                           "wrapper')")
    return declared


def selected_specs(args: argparse.Namespace, wrap: DeclaredWrapper | None) -> list:
    """The tier's cases of the chosen families; under --wrap, the declared wrapper's families' cases under its name."""
    if wrap is None:
        return [spec for family in args.family or sorted(FAMILIES) for spec in FAMILIES[family](args.tier)]
    families = [f for f in args.family or sorted(WRAPPER_FAMILIES) if f in wrap.families]
    return [spec for family in families for spec in wrap.specs(family, FAMILIES[family](args.tier))]


def run_one(spec, rank: int, world: int, wrap: DeclaredWrapper | None) -> tuple[object, str | None, float]:
    began = time.perf_counter()
    try:
        return run_dist_case(rank, world, DistCase(spec, wrap)), None, time.perf_counter() - began
    except Exception:  # a rank's failure becomes its case's verdict, as in the pool
        return None, traceback.format_exc(), time.perf_counter() - began


def _nodeid(spec) -> str:
    return f"torchrun::{spec.dist.wrapper}-{spec.id}"


def _row(spec, outcome: str, reason: str, duration: float, figures: dict) -> dict:
    return {"nodeid": _nodeid(spec), "case_id": spec.id, "family": spec.family,
            "backend": spec.dist.wrapper, "outcome": outcome, "reason": reason, "duration": duration,
            "figures": figures, "spec": spec.to_dict(), "expectation": None, "worker": "torchrun",
            "device": str(run_device.active())}


def row(spec, result: PoolResult, duration: float, entries: list | None = None) -> dict:
    """The case's row from every rank's outcome, judged check by check against its known gaps as the plugin judges
    (te_verify.expectations.judge); a failure names each rank that failed and how."""
    verdicts = dist_verdicts(spec, result)
    figures = {**rank_peaks(result), **{k: v for verdict in verdicts for k, v in verdict.figures.items()}}
    judgement = judge(entries or [], check_results(verdicts))
    case_row = {**_row(spec, judgement.outcome, judgement.message, duration, figures), "checks": judgement.checks}
    if entries:
        case_row.update(expectation=entries[0].to_row(), gaps=[e.to_row() for e in entries])
    if judgement.outcome == "xfailed":
        case_row["observed"] = "\n".join(v.message for v in verdicts if not v.ok)[:2000]
    return case_row


def skipped_row(spec, world: int, entry=None) -> dict:
    """A case not run: of another world size, or a skip entry's."""
    if spec.dist.world_size != world:
        return _row(spec, "skipped", f"world size {spec.dist.world_size}: this torchrun world has {world} ranks", 0.0, {})
    return {**_row(spec, "skipped", mark_reason(entry), 0.0, {}), "expectation": entry.to_row()}


def start(choice: str | None) -> tuple[int, int]:
    """Join torchrun's process group on this rank's device; (rank, world size)."""
    device = run_device.use(run_device.torchrun_device(choice, int(os.environ.get("LOCAL_RANK", "0"))))
    dist.init_process_group(backend_for(device.type))
    return dist.get_rank(), dist.get_world_size()


def gather_case(spec, rank: int, world: int, wrap: DeclaredWrapper | None = None, entries: list | None = None) -> dict | None:
    """Run `spec` on every rank; rank 0 gets its row, the others None."""
    outcome, error, duration = run_one(spec, rank, world, wrap)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object((outcome, error), gathered, dst=0)
    if rank != 0:
        return None
    errors = {r: e for r, (_, e) in enumerate(gathered) if e}
    return row(spec, PoolResult([o for o, _ in gathered], errors, 0.0, duration), duration, entries)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        expectations, wrap = load_expectations(Path(args.expectations)), load_wrap(args.wrap)
        if args.case_timeout is not None and args.case_timeout < 0:
            raise ValueError(f"--case-timeout {args.case_timeout:g}: expected seconds >= 0 (0: none)")
        rank, world = start(args.device)
        lock = claim_report_dir(args.report_dir, rank, f"torchrun-{os.getpid()}")
    except (run_device.DeviceError, ExpectationsError, WrapperError, ReportLockError, ValueError) as exc:
        print(f"te_verify.distributed: {exc}", file=sys.stderr)
        return 2
    started = datetime.datetime.now(datetime.timezone.utc).isoformat()
    places = [None] * world
    dist.all_gather_object(places, f"{socket.gethostname()}/{run_device.active()}")
    specs = selected_specs(args, wrap)
    header = run_header(args, started, places, specs)
    stream = RowStream(Path(args.report_dir)) if rank == 0 and args.report_dir else None
    if stream is not None:  # rank 0 streams each row as it finishes: a killed job keeps them
        stream.write("header", header)
        stream.write("selection", {"nodeids": [_nodeid(spec) for spec in specs]})
    timeout = CaseTimeout(rank, args.report_dir, stream, timed_out_row)
    rows = run_cases(specs, expectations, rank, world, wrap, stream, timeout, case_seconds(args))
    code = [exit_code(rows)]
    if rank == 0:
        write(args, rows, header)
        if lock is not None:
            lock.release()
    dist.broadcast_object_list(code, src=0)  # every rank exits as rank 0 judged, so torchrun reports it
    dist.barrier()  # no rank exits while a peer still talks to it
    return code[0]


def run_cases(specs: list, expectations: list, rank: int, world: int, wrap: DeclaredWrapper | None,
              stream: RowStream | None, timeout: CaseTimeout, seconds: float | None) -> list[dict]:
    """Every case in turn on every rank, each under the job's case timeout; rank 0's rows (the others' are empty)."""
    env = {"te_version": None, "device": environment.device()}  # the expectations' scope: the lane runs no TE
    rows = []
    for spec in specs:
        entries = covering(expectations, spec.dist.wrapper, spec.id, _nodeid(spec), env, spec.family)
        skip = skip_entry(entries)
        if spec.dist.world_size != world or skip is not None:
            rows.append(skipped_row(spec, world, skip))
        else:
            timeout.arm(spec, seconds)
            try:
                case_row = gather_case(spec, rank, world, wrap, entries)
            finally:
                timeout.disarm()
            if case_row is None:
                continue
            rows.append(case_row)
        if stream is not None:
            stream.write("row", rows[-1])
    return rows


def case_seconds(args: argparse.Namespace) -> float | None:
    """--case-timeout, or the tier's default for a distributed case (te_verify.case_timeout.DEFAULT_S); None: none."""
    seconds = DEFAULT_S[args.tier]["dist"] if args.case_timeout is None else args.case_timeout
    return seconds or None


def timed_out_row(spec, seconds: float, message: str) -> dict:
    """The row of a case that ran past its timeout: failed, with the stacks where rank 0 was."""
    return _row(spec, "failed", message, seconds, {})


def exit_code(rows: list[dict]) -> int:
    """1 when a case failed unexpectedly or passed where a gap is recorded, else 0."""
    return int(any(r["outcome"] in ("failed", "xpassed") for r in rows))


def run_header(args: argparse.Namespace, started: str, places: list[str], specs: list) -> dict:
    """The report header of this torchrun job (streamed first; `finished` and the compatibility steps the ranks
    applied are added at the end)."""
    from te_verify import compat
    from te_verify.te import api as te_api

    te_impl = {"name": "-", "why": "these cases use torch.nn.Linear"}
    if any(spec.te is not None for spec in specs):  # TE's Linear under an engine (matrix.engines.te_megatron_specs)
        impl = te_api.active()
        te_impl = {"name": impl.name, "why": impl.why, "ran": impl.describe}
    return {"run_id": f"torchrun-{os.getpid()}", "started": started, "tier": args.tier, "argv": sys.argv,
            "versions": environment.versions(), "device": environment.device(), "devices": places, "shard": None,
            "te_impl": te_impl, "compat": list(compat.APPLIED), "backends": {}}


def write(args: argparse.Namespace, rows: list[dict], header: dict) -> None:
    from te_verify.report.writer import write_report

    counts = {o: sum(r["outcome"] == o for r in rows) for o in ("passed", "failed", "xfailed", "xpassed", "skipped")}
    print(f"te_verify.distributed: {len(rows)} cases: " + ", ".join(f"{n} {o}" for o, n in counts.items() if n))
    if not args.report_dir:
        return
    from te_verify import compat

    header = {**header, "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "compat": sorted(set(header["compat"]) | set(compat.APPLIED))}
    path = write_report(Path(args.report_dir), {"schema_version": 1, "header": header, "rows": rows})
    print(f"te_verify.distributed: wrote {path}")


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Neither destroy_process_group() nor the interpreter's teardown: on torch 2.13 either can abort a gloo rank
    # (SIGABRT, "terminate called without an active exception"; cf. pytorch PR #179291), and torchrun's agent on the
    # other node then waits out its exit barrier. main()'s barrier leaves no collective in flight.
    os._exit(status)
