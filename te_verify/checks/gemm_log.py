"""Minimal work of the TE lane: per layer and backward pass, the GEMMs the case requires (fprop always; dgrad iff
the layer's input needs a gradient; wgrad iff the weight is trainable; bgrad iff the bias is trainable) and the
saved copies (input iff wgrad, weight iff dgrad), read from the reference GEMM log; and the waste figures
(issue 4) of every TE-lane case against te_verify.oracle. Pure functions of records.

Sources of the figures: FLOPs from the reference GEMM log (GEMMs only; the bgrad reductions are not GEMMs, as in
the oracle and the torch lane's flop counter); saved-for-backward bytes and count from te_verify.probes.saved
(autograd's saves, new storages only, the torch lane's definition), which sees the reference's plain and FP8
saves alike. Both are exact against the oracle; a surplus is named by layer and role from the GEMM log's
saved-tensor events. Without a GEMM log (real TE) or a saved probe the actual figures are "unknown".
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from te_verify.checks.verdict import Verdict, waste_ratio
from te_verify.oracle import graph_exists, input_needs_grad, required_flops, required_saved, trainable_masks
from te_verify.record import Record
from te_verify.spec import CaseSpec

UNKNOWN = "unknown"


def required_roles(spec: CaseSpec) -> dict[str, set[str]]:
    """Layer label -> backward roles required ("dgrad", "wgrad", "bgrad"), from the masks in force at backward."""
    weights, biases = trainable_masks(spec)
    return {str(i): {role for role, needed in (("dgrad", needs), ("wgrad", weights[i]), ("bgrad", biases[i])) if needed}
            for i, needs in enumerate(input_needs_grad(spec))}


def _why(role: str) -> str:
    return {"wgrad": "frozen weight", "bgrad": "frozen bias", "dgrad": "input needs no grad"}.get(role, role)


def gemm_work(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """Each backward pass runs exactly the required GEMMs per layer; each forward one fprop per layer."""
    events = record.observations.get("gemm_log")
    if events is None:
        return Verdict("gemm_work", False, f"[{case_id}] backend {backend}: no GEMM log (run without GemmProbe?)")
    counts = Counter((e.layer, e.role) for e in events)
    passes = record.passes_done
    required = required_roles(spec)
    problems = []
    for layer, roles in required.items():
        for role in ("dgrad", "wgrad", "bgrad"):
            want = passes if role in roles else 0
            got = counts[(layer, role)]
            if got != want:
                label = f"layer {layer}" + (f" ({_why(role)})" if role not in roles else "")
                problems.append(f"{label}: {got} {role} GEMM{'s' if got != 1 else ''}, {want} required")
        if counts[(layer, "fprop")] != 1:
            problems.append(f"layer {layer}: {counts[(layer, 'fprop')]} fprop GEMMs, 1 required")
    figures = flops_figures(spec, events)
    if record.error is None and figures["flops_actual"] != figures["flops_required"]:
        problems.append(f"FLOPs {figures['flops_actual']:,} vs {figures['flops_required']:,} required "
                        f"(ratio {figures['flops_ratio']})")
    if problems:
        return Verdict("gemm_work", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict("gemm_work", True, figures=figures)


def saved_copies(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """Forward saved the input copy iff wgrad is required and the weight copy iff dgrad is required."""
    saved = record.observations.get("te_saved")
    if saved is None:
        return Verdict("saved_copies", False, f"[{case_id}] backend {backend}: no saved-tensor log")
    kinds = Counter((e.layer, e.kind) for e in saved)
    problems = []
    for layer, roles in required_roles(spec).items():
        for kind, role in (("input", "wgrad"), ("weight", "dgrad")):
            want, got = int(role in roles), kinds[(layer, kind)]
            if got != want:
                nbytes = sum(e.bytes for e in saved if e.layer == layer and e.kind == kind)
                what = f"saved its {kind} copy ({nbytes} B) for a {role} that is not required" if got > want \
                    else f"did not save its {kind} copy, but its {role} is required"
                problems.append(f"layer {layer}: {what}")
    figures = {"te_saved_copy_bytes": sum(e.bytes for e in saved), "te_saved_copy_count": len(saved)}
    if problems:
        return Verdict("saved_copies", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict("saved_copies", True, figures=figures)


def flops_figures(spec: CaseSpec, events: list) -> dict[str, Any]:
    """flops_actual (the log's GEMMs, bgrad reductions excluded), flops_required and their ratio."""
    actual, required = sum(e.flops for e in events if e.role != "bgrad"), required_flops(spec)
    return {"flops_actual": actual, "flops_required": required, "flops_ratio": waste_ratio(actual, required)}


def _surplus_copies(spec: CaseSpec, record: Record) -> list[str]:
    """Logged saves that no required GEMM uses, by layer and role: "layer 1 (dgrad not needed): ..."."""
    required = required_roles(spec)
    lines = []
    for e in record.observations.get("te_saved", []):
        role = "wgrad" if e.kind == "input" else "dgrad"
        if role not in required.get(e.layer, set()):
            size = f"{e.bytes:,} B FP8" if e.fp8 else "by reference"
            lines.append(f"layer {e.layer} ({role} not needed): saved {e.kind} copy ({size}), 0 required")
    return lines


def saved_bytes(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """Saved-for-backward bytes and count (new storages, te_verify.probes.saved) equal the oracle's, exactly."""
    need = required_saved(spec)
    figures: dict[str, Any] = {"saved_bytes_required": need.nbytes, "saved_count_required": need.count}
    if "saved_count_raw" not in record.figures:
        figures.update(saved_bytes_actual=UNKNOWN, saved_count_actual=UNKNOWN, saved_bytes_ratio=UNKNOWN)
        return Verdict("te_saved_bytes", False, f"[{case_id}] backend {backend}: no saved-tensor figures "
                                                f"(run without SavedTensorsProbe?)", figures)
    actual, count = record.figures["saved_bytes_actual"], record.figures["saved_count_actual"]
    figures.update(saved_bytes_actual=actual, saved_count_actual=count, saved_bytes_ratio=waste_ratio(actual, need.nbytes))
    if (actual, count) == (need.nbytes, need.count):
        return Verdict("te_saved_bytes", True, figures=figures)
    named = _surplus_copies(spec, record) or [f"no logged copy explains it (probe saw {record.figures.get('saved_by_layer')})"]
    return Verdict("te_saved_bytes", False, f"[{case_id}] backend {backend}: saved-for-backward {actual:,} B in {count} "
                                            f"tensors vs {need.nbytes:,} B in {need.count} required (ratio "
                                            f"{figures['saved_bytes_ratio']}); " + "; ".join(named), figures)


def te_waste(case_id: str, backend: str, spec: CaseSpec, record: Record, skip: str | None = None) -> list[Verdict]:
    """The TE lane's waste verdicts (GEMMs by layer and role, FLOPs, saved bytes), each with its figures.

    Not judged (actual figures "unknown", reason in `waste_skipped`) when `skip` says why, when the run raised
    (a cut-short run has partial figures; the replay check judges it), or when there is no GEMM log (real TE).
    """
    if skip is None and record.error is not None and graph_exists(spec):
        skip = f"run raised in pass {record.error_pass}"
    if skip is None and record.observations.get("gemm_log") is None:
        skip = "no reference GEMM log (the TE GEMMs run outside the reference runtime)"
    if skip is not None:
        need = required_saved(spec)
        figures = {"flops_required": required_flops(spec), "saved_bytes_required": need.nbytes,
                   "saved_count_required": need.count, "waste_skipped": skip}
        figures.update({k: UNKNOWN for k in ("flops_actual", "flops_ratio", "saved_bytes_actual",
                                             "saved_bytes_ratio", "saved_count_actual")})
        return [Verdict("te_waste", True, figures=figures)]
    return [gemm_work(case_id, backend, spec, record), saved_bytes(case_id, backend, spec, record)]
