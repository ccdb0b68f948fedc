"""The TE lane's waste over a microbatch iteration (te_contract, te_delayed: run.microbatch labels each microbatch's
forward ("forward", m) and backward ("backward", m), backward_dw included): `gemm_work` as checks.te_waste judges one
forward and backward, for every microbatch in its own passes (checks.accumulation's rule for the torch lane), from
the same sources below TE (the tex record, or aten under a pure-PyTorch --te-impl); `te_saved_bytes` in high
precision, each microbatch's inputs kept for its own backward (an FP8 case's weight copies are TE's is_first_microbatch
cache, alive between the microbatches' forwards whatever backward keeps: no oracle says which of its copies backward
may hold yet, so the row says "not judged" there)."""
from __future__ import annotations

import dataclasses

from te_verify.checks.te_waste import flops_figures, measured_gemms, saved_bytes, unmeasured_calls, work_problems
from te_verify.checks.verdict import Verdict, not_observed
from te_verify.oracle.required import RequiredSaved, required_saved
from te_verify.record import Record
from te_verify.spec import CaseSpec


def pair_of(spec: CaseSpec) -> CaseSpec:
    """One microbatch of a TE microbatch case: what each microbatch's forward and backward must spend."""
    return spec.replace(te=dataclasses.replace(spec.te, microbatches=1, accumulation="interleaved"))


def microbatch_gemm_work(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """Each of the iteration's te.microbatches spends exactly one pair's GEMMs per layer and role (FLOPs, and operand
    bytes at the tex boundary) in its own passes; a GEMM outside every microbatch's passes is waste. Not observed
    where the run raised (`ending` says how) or ran without a GEMM probe."""
    count, pair = spec.te.microbatches, pair_of(spec)
    events = measured_gemms(spec, record)
    if record.error is not None:
        return not_observed("gemm_work", case_id, backend, "the run raised (ending says how); its figures are partial")
    if events is None:
        return not_observed("gemm_work", case_id, backend, "no GEMM probe ran", blocked_by=None)
    figures = {**flops_figures(pair, events, count), "microbatches": count}
    stray = [e for e in events if not 1 <= e.pass_index <= count]
    problems = unmeasured_calls(record)
    if stray:
        problems.append(f"{len(stray)} GEMM(s) outside every microbatch's passes ({sum(e.flops for e in stray):,} FLOPs)")
    for m in range(1, count + 1):
        problems += [f"microbatch {m}: {line}" for line in work_problems(pair, [e for e in events if e.pass_index == m], 1)]
    if figures["flops_actual"] != figures["flops_required"]:
        problems.append(f"FLOPs {figures['flops_actual']:,} vs {figures['flops_required']:,} required over {count} "
                        f"microbatch(es) (ratio {figures['flops_ratio']})")
    if problems:
        return Verdict("gemm_work", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict("gemm_work", True, figures=figures)


FP8_SAVED = ("not judged: an FP8 microbatch case's weight copies are TE's is_first_microbatch cache, which no oracle "
             "splits into what backward may keep yet")


def microbatch_waste(case_id: str, backend: str, spec: CaseSpec, record: Record) -> list[Verdict]:
    """gemm_work over the iteration's microbatches, and in high precision te_saved_bytes: every microbatch's saves
    (its inputs, for its own wgrads) are one pair's, te.microbatches times, however the passes were ordered."""
    verdicts = [microbatch_gemm_work(case_id, backend, spec, record)]
    if spec.te.recipe is not None:
        return verdicts
    if record.error is not None:
        return verdicts + [not_observed("te_saved_bytes", case_id, backend, "the run raised (ending says how)")]
    pair, count = required_saved(pair_of(spec)), spec.te.microbatches
    need = RequiredSaved(count * pair.nbytes, count * pair.count, pair.items * count)
    return verdicts + [saved_bytes(case_id, backend, spec, record, need)]
