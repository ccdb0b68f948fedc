"""Minimal-work checks for model families (spec.model): the linear sites against the oracle, the rest against eager.

- GEMMs and FLOPs: every linear site's GEMMs by pass and role equal the oracle's (te_verify.oracle.graph);
  a surplus names the site. Batched GEMMs that touch no site (attention's q@k^T and p@v, where a backend
  decomposes scaled-dot-product attention; eager runs it as one fused kernel) are outside the rule: counted and
  reported per pass, not judged.
- Saved for backward, per value a site reads, by bytes: a value some site's wgrad needs is kept once (the value or
  one copy of it, whole or in parts that add up to it, as a batch run in two halves saves it; a second copy's bytes are
  a surplus naming its sites); beyond that, only as many bytes as eager keeps (attention saves its output, which is o's input, and LitGPT's o reads a layout copy of it: the report
  says so per site). Everything else saved (norms, activations, attention internals) is recorded beside eager's bytes,
  not judged: no structural rule exists for it, and backends trade saving for recomputing there (measured on
  LoRA-on-every-projection blocks: torch.compile saves about 20% less than eager, thunder 0.2.6 about 7% more).
- Under autocast (spec.autocast), per site: at most one cast copy of its weight kept, and only where its dgrad needs
  it (what eager's autocast keeps).
- Peak memory is recorded beside eager's, not judged: no structural bound exists for attention and norm
  intermediates, and eager's schedule is not the only valid one.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch

from te_verify.checks.verdict import Verdict, not_observed, waste_ratio
from te_verify.checks.waste import flops_verdict, site_at
from te_verify.oracle.required import graph_exists, required_saved, sites
from te_verify.record import Record
from te_verify.spec import CaseSpec

BATCHED_GEMMS = ("aten.bmm", "aten.baddbmm")


def outside_sites(event: Any) -> bool:
    """A batched GEMM no linear site can be named for: attention internals."""
    return event.layer is None and event.op.startswith(BATCHED_GEMMS)


def _gemm_verdict(spec: CaseSpec, got: Record, backend: str) -> Verdict:
    events = got.observations.get("gemm_events", [])
    inside = [e for e in events if not outside_sites(e)]
    verdict = flops_verdict(spec, got, backend, events=inside)
    outside = [e for e in events if outside_sites(e)]
    verdict.figures.update(gemms_outside_sites=len(outside), flops_outside_sites=sum(e.flops for e in outside),
                           gemms_outside_by_pass=dict(Counter(str(e.pass_index) for e in outside)))
    return verdict


def _value_of(spec: CaseSpec, item: Any) -> str | None:
    """The site value a saved storage is (or copies): the fx value its site(s) read; None for anything else."""
    layers = item.shared_by or ({item.layer} if item.layer is not None else set())
    if item.kind not in ("input", "input_copy") or not layers:
        return None
    return site_at(spec, min(layers)).input_value


def _sites_reading(spec: CaseSpec, value: str) -> str:
    return ", ".join(s.label for s in sites(spec) if s.input_value == value)


def _view_bytes(item: Any) -> int:
    """Bytes of a saved site value as the tensor saved (its shape and dtype), not of the storage under it: a compiler
    may save a view into a buffer packing several values, whose storage is not the value's size."""
    dtype = getattr(torch, item.dtype.removeprefix("torch."), None) if item.dtype else None
    if not isinstance(dtype, torch.dtype):
        return item.nbytes
    return min(item.nbytes, math.prod(item.shape) * dtype.itemsize)


def _saved_by_value(spec: CaseSpec, record: Record) -> tuple[Counter, Counter, int]:
    """(storages per site value, their bytes as saved, bytes of everything else) of a run's new saved storages."""
    count, nbytes, other = Counter(), Counter(), 0
    for item in record.observations.get("saved_storages", []):
        value = _value_of(spec, item)
        if value is None:
            other += item.nbytes
        else:
            count[value] += 1
            nbytes[value] += _view_bytes(item)
    return count, nbytes, other


def _weight_copy_problems(spec: CaseSpec, got: Record) -> list[str]:
    """Under autocast every site's GEMMs read a cast copy of its weight: at most one kept for backward, and only where
    the site's dgrad needs it (a frozen weight's copy with no dgrad to feed, or a second copy, is waste). Without
    autocast a weight is its Parameter, not a new saved storage, and nothing is judged here."""
    if not spec.autocast:
        return []
    copies = Counter(item.layer for item in got.observations.get("saved_storages", [])
                     if item.kind == "weight_copy" and item.layer is not None)
    problems = []
    for layer, n in sorted(copies.items()):
        site = site_at(spec, layer)
        allowed = int("dgrad" in site.roles())
        if n > allowed:
            problems.append(f"site {site.label} ({'trainable' if site.weight_trainable else 'frozen'} weight, dgrad "
                            f"{'needed' if allowed else 'not needed'}): saved {n} cast copies of its weight, "
                            f"{allowed} required")
    return problems


def family_saved_verdict(spec: CaseSpec, got: Record, eager: Record, backend: str, label: str | None = None
                         ) -> Verdict:
    """Saved tensors per site value against the oracle, what is not a site beside `eager`'s run (`label` names the
    run; default "<case id> [<backend>]")."""
    need = required_saved(spec)
    required = Counter()  # bytes of each site value backward needs kept (one copy of it)
    for layer, _, size in need.items:
        required[site_at(spec, layer).input_value] += size
    count, nbytes, other = _saved_by_value(spec, got)
    eager_count, eager_bytes, eager_other = _saved_by_value(spec, eager)
    # Eager keeps a site value beyond the rule where something that is not a site saves it too: attention keeping
    # its output, which is o's input (a second storage where the model copies it into o's layout, as LitGPT does).
    eager_extra = sorted(v for v, n in eager_bytes.items() if n > required[v])
    problems = []
    # Weighed, not counted: a value saved in parts (a batch run as two halves) adds up to one copy of it; a second
    # copy of the same bytes is more than one.
    for value, n in sorted(count.items()):
        allowed = max(required[value], eager_bytes[value])
        if nbytes[value] > allowed:
            problems.append(f"sites {_sites_reading(spec, value)}: saved their input {n} time(s) "
                            f"({nbytes[value]:,} B), {allowed:,} B allowed ({required[value]:,} B required, "
                            f"{eager_bytes[value]:,} B in {eager_count[value]} storage(s) in eager)")
    problems += _weight_copy_problems(spec, got)
    figures = {"saved_bytes_required": need.nbytes, "saved_count_required": need.count,
               "saved_sites_bytes": sum(nbytes.values()), "saved_outside_sites_bytes": other,
               "saved_outside_sites_bytes_eager": eager_other,
               "saved_outside_sites_ratio_to_eager": waste_ratio(other, eager_other),
               "saved_sites_beyond_rule_in_eager": "; ".join(_sites_reading(spec, v) for v in eager_extra),
               "saved_compared": len(got.observations.get("saved_storages", []))}
    message = "" if not problems else f"{label or f'{spec.id} [{backend}]'}: saved for backward: " + "; ".join(problems)
    return Verdict("waste_saved", not problems, message, figures)


def family_waste_verdicts(spec: CaseSpec, got: Record, eager: Record, backend: str) -> list[Verdict]:
    """GEMMs/FLOPs per site, saved tensors per site value and beyond, for a probed run and eager's probed run."""
    if got.error is not None and (graph_exists(spec) or got.output is None):
        why = f"the run raised in pass {got.error_pass} (ending says how); its figures are partial"
        return [not_observed(c, spec.id, backend, why) for c in ("waste_flops", "waste_saved")]
    peak = {"peak_bytes": got.figures.get("peak_bytes", 0), "peak_bytes_eager": eager.figures.get("peak_bytes", 0),
            "peak_ratio_to_eager": waste_ratio(got.figures.get("peak_bytes", 0), eager.figures.get("peak_bytes", 0)),
            "peak_judged": "no: recorded beside eager's (no structural bound for a model family)"}
    return [_gemm_verdict(spec, got, backend), family_saved_verdict(spec, got, eager, backend),
            Verdict("waste_peak", True, "", peak)]
