"""The work of gradient accumulation (CaseSpec.microbatches on the torch lane), judged as for one forward and
backward: each microbatch's forward and backward GEMMs, however the passes were ordered, against the oracle's for
a pair (checks.waste.gemm_problems), named by microbatch. The probes label each pass with its microbatch
(run.microbatch): forward phase ("forward", m), backward ("backward", m)."""
from __future__ import annotations

import dataclasses

from te_verify.checks.verdict import Verdict, not_observed, waste_ratio
from te_verify.checks.waste import gemm_problems
from te_verify.oracle.required import required_flops
from te_verify.record import Record
from te_verify.spec import CaseSpec


def _pair_events(events: list, microbatch: int) -> list:
    """Microbatch `microbatch`'s GEMMs as one pair's: its forward as pass 0, its backward as pass 1."""
    return [dataclasses.replace(e, pass_index=0 if e.phase == "forward" else 1)
            for e in events if e.pass_index == microbatch]


def accumulated_work(spec: CaseSpec, record: Record, backend: str) -> Verdict:
    """waste_flops over an iteration's microbatches (checks.iterations gives each its record): every microbatch spends exactly the GEMMs one forward
    and backward of the spec require (fprop always, dgrad where the input needs a gradient, wgrad where the weight
    trains), in the passes of its own microbatch; a GEMM outside every microbatch's passes is waste too."""
    events = record.observations.get("gemm_events")
    head = f"{spec.id} [{backend}]"
    if record.error is not None or events is None:
        if record.error is not None:
            return not_observed("waste_flops", spec.id, backend, "the run raised (ending says how)")
        return not_observed("waste_flops", spec.id, backend, "no GEMM probe ran", blocked_by=None)
    pair = spec.replace(microbatches=1, accumulation="interleaved")
    required, actual = spec.microbatches * required_flops(pair), sum(e.flops for e in events)
    figures = {"flops_actual": actual, "flops_required": required, "flops_ratio": waste_ratio(actual, required),
               "gemms_compared": len(events), "microbatches": spec.microbatches}
    problems, notes = [], []
    stray = [e for e in events if not 1 <= e.pass_index <= spec.microbatches]
    if stray:
        problems.append(f"{len(stray)} GEMM(s) outside every microbatch's passes "
                        f"({sum(e.flops for e in stray):,} FLOPs)")
    for m in range(1, spec.microbatches + 1):
        found, seen = gemm_problems(pair, _pair_events(events, m))
        problems += [f"microbatch {m} {line}" for line in found]
        notes += [f"microbatch {m} {line}" for line in seen]
    if notes:
        figures["gemm_attribution"] = "; ".join(notes)
    ok = actual <= required and not problems
    message = "" if ok else f"{head}: FLOPs {actual:,} vs {required:,} required over {spec.microbatches} " \
                            f"microbatches; " + "; ".join(problems)
    return Verdict("waste_flops", ok, message, figures)
