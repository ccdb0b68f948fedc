"""Minimal work on the reference GEMM log: per layer and backward pass, the GEMMs the case requires
(fprop always; dgrad iff the layer's input needs a gradient; wgrad iff the weight is trainable; bgrad iff
the bias is trainable) and the saved copies (input iff wgrad, weight iff dgrad). Pure functions of records.
"""
from __future__ import annotations

from collections import Counter

from te_verify.checks.verdict import Verdict
from te_verify.record import Record
from te_verify.spec import CaseSpec


def required_roles(spec: CaseSpec) -> dict[str, set[str]]:
    """Layer label -> backward roles required ("dgrad", "wgrad", "bgrad"), from the masks in force at backward."""
    weight_frozen, bias_frozen = spec.frozen_after_prepare()
    upstream_trainable = spec.input_requires_grad
    roles: dict[str, set[str]] = {}
    for i in range(spec.n_layers):
        need = set()
        if upstream_trainable:
            need.add("dgrad")
        if not weight_frozen[i]:
            need.add("wgrad")
        if bias_frozen is not None and not bias_frozen[i]:
            need.add("bgrad")
        roles[str(i)] = need
        upstream_trainable = upstream_trainable or not weight_frozen[i] or (bias_frozen is not None and not bias_frozen[i])
    return roles


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
    figures = {"flops_actual": sum(e.flops for e in events)}
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
    figures = {"saved_bytes_actual": sum(e.bytes for e in saved), "saved_count_actual": len(saved)}
    if problems:
        return Verdict("saved_copies", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict("saved_copies", True, figures=figures)
