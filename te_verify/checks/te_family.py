"""Minimal GEMM work of a model family on the TE lane (LoRA over TE Linear: spec.model.te_base), per linear site.

Each site is held to the oracle's rule (te_verify.oracle over the family's module graph): one fprop; per backward
pass one dgrad iff its input needs a gradient and one wgrad iff its weight is trainable, so a frozen TE base runs
NO wgrad GEMM. Judged by the FLOPs each site spends per pass and role, however many GEMMs spent them (split-K).
Sources, both below the implementation under test and both naming sites by qualified module name:
- the TE bases ("<projection>.base"): under TE's Python, the tex record (probes.tex_gemm), attributed by parameter
  provenance; a base GEMM seen only by aten (outside any tex call) is then a failure: the base was not run by TE.
  Under a pure-PyTorch --te-impl (a user's build, the reference) there is no tex record: its GEMMs are the aten
  GEMMs it dispatches, followed through its casts to the weights and activations they copy, as for every site.
- every other site (the adapters' lora_a/lora_b, projections without an adapter): aten's GEMMs outside tex calls
  (probes.tex_gemm.AtenGemmOutsideTex; the tex emulation's own aten GEMMs are left out there). A site a TE
  executor claimed (thunder) may show in the tex record instead; both sources are counted.
Attention's batched GEMMs name no site (checks.family_waste.outside_sites): counted, not judged.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from te_verify.checks.family_waste import outside_sites
from te_verify.checks.verdict import Verdict, not_observed, waste_ratio
from te_verify.oracle.required import graph_exists, required_flops, sites, te_sites
from te_verify.record import Record
from te_verify.spec import CaseSpec

ROLES = ("fprop", "dgrad", "wgrad")


def _why(role: str) -> str:
    return {"wgrad": "frozen weight", "dgrad": "input needs no grad"}[role]


def tex_site_events(spec: CaseSpec, record: Record) -> list[tuple[Any, int, str, int]]:
    """(site, pass, role, FLOPs) of every tex GEMM (pass 0: the forward). The site is a label, "?" when unknown, or a
    frozenset of labels for a wgrad GEMM that can only be narrowed to several sites.

    probes.tex_gemm attributes a wgrad to the last fprop that read its activation; a family's sites share inputs
    (q, k and v read one value), so here every site whose fprop read it is a candidate, narrowed by the weight's
    (out, in) shape and then by the dgrad just before it (TE's Linear backward runs its dgrad, then its wgrad)."""
    tex_record, params = record.observations["tex_record"], record.observations["param_layers"]
    shapes = {s.label: (s.fan_out, s.fan_in) for s in sites(spec)}
    consumers: dict[Any, list[str]] = {}
    events, last_dgrad = [], None
    for g in tex_record.gemms:
        k = 0 if g.phase == "forward" else g.pass_index
        site: Any = "?"
        if g.role in ("fprop", "dgrad"):
            site = params.get(g.a_root, "?")
            if g.role == "fprop" and site != "?" and g.b_root is not None:
                consumers.setdefault(g.b_root, []).append(site)
            last_dgrad = site if g.role == "dgrad" else last_dgrad
        elif g.role == "wgrad":
            found = {params[g.d_root]} if g.d_root in params else set(consumers.get(g.a_root, ()))
            found = {c for c in found if shapes.get(c) == (g.m, g.n)} or found
            if len(found) > 1 and last_dgrad in found:
                found = {last_dgrad}
            site = next(iter(found)) if len(found) == 1 else frozenset(found) if found else "?"
        events.append((site, k, g.role, g.flops))
    return events


def site_gemms(record: Record, tex_events: list) -> tuple[Counter, Counter, Counter, dict[str, Any]]:
    """(tex counts, aten counts) by (site label, pass, role), tex wgrads narrowed to several sites by (site set,
    pass), and the rest: what names no site, and the FLOPs of both sources ("flops", by the same keys as the counts;
    "group_flops", by the groups' keys); `tex_events` from tex_site_events."""
    tex, aten, groups, flops, group_flops = Counter(), Counter(), Counter(), Counter(), Counter()
    tex_unattributed = aten_unattributed = 0
    outside = []
    for site, k, role, gemm_flops in tex_events:
        if site == "?" or role not in ROLES:
            tex_unattributed += 1
        elif isinstance(site, frozenset):
            groups[(site, k)] += 1
            group_flops[(site, k)] += gemm_flops
        else:
            tex[(site, k, role)] += 1
            flops[(site, k, role)] += gemm_flops
    labels = record.observations.get("aten_gemm_labels", [])
    for e in record.observations.get("aten_gemm_events", []):
        if outside_sites(e):
            outside.append(e)
        elif e.layer is None or e.layer >= len(labels) or e.role not in ROLES:
            aten_unattributed += 1
        else:
            key = (labels[e.layer], 0 if e.phase == "forward" else e.pass_index, e.role)
            aten[key] += 1
            flops[key] += e.flops
    return tex, aten, groups, {"tex_unattributed": tex_unattributed, "aten_unattributed": aten_unattributed,
                               "outside": outside, "flops": flops, "group_flops": group_flops}


def _group_problems(spec: CaseSpec, groups: Counter, tex: Counter, aten: Counter, other: dict[str, Any]
                    ) -> tuple[list[str], set]:
    """Wgrads known only to belong to one of several sites: their FLOPs against those sites' required wgrads'."""
    roles = {s.label: s.roles() for s in sites(spec)}
    site_flops = {s.label: s.gemm_flops() for s in sites(spec)}
    problems, judged = [], set()
    for (group, k), n in sorted(groups.items(), key=lambda item: (sorted(item[0][0]), item[0][1])):
        labels = sorted(group)
        judged |= {(label, k) for label in labels}
        got = n + sum(tex[(l, k, "wgrad")] + aten[(l, k, "wgrad")] for l in labels)
        want = sum("wgrad" in roles[l] for l in labels)
        got_flops = other["group_flops"][(group, k)] + sum(other["flops"][(l, k, "wgrad")] for l in labels)
        want_flops = sum(site_flops[l] for l in labels if "wgrad" in roles[l])
        if got_flops != want_flops:
            frozen = [l for l in labels if "wgrad" not in roles[l]]
            problems.append(f"sites {' | '.join(labels)}: {got} wgrad GEMMs in backward pass {k}, {want} required"
                            + (f" ({', '.join(frozen)}: frozen weight)" if frozen else "")
                            + f" (FLOPs {got_flops:,} vs {want_flops:,} required)")
    return problems, judged


def te_family_gemms(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """Every site's GEMMs by pass and role equal the oracle's; the TE bases' come from the tex record (TE's Python),
    or from aten where no tex record was kept (a pure-PyTorch --te-impl: its GEMMs are aten's)."""
    if "aten_gemm_events" not in record.observations:
        return Verdict("te_family_gemms", False, f"[{case_id}] backend {backend}: no aten GEMM record (run without "
                                                 f"AtenGemmOutsideTex?)")
    # Under TE's Python a base's GEMMs run inside tex calls, which aten's record leaves out: without the tex record
    # they are missing (a failure below), never credited to aten.
    te_python = "tex_record" in record.observations
    tex_events = tex_site_events(spec, record) if te_python else []
    tex, aten, groups, other = site_gemms(record, tex_events)
    te = set(te_sites(spec))
    passes = record.passes_done if graph_exists(spec) else 0
    problems = [f"{n} {src} GEMM(s) not attributable to a site" for src, n in
                (("tex", other["tex_unattributed"]), ("aten", other["aten_unattributed"])) if n]
    grouped, judged = _group_problems(spec, groups, tex, aten, other)
    problems += grouped
    for site in sites(spec):
        label, roles = site.label, site.roles()
        if site.label in te and te_python:
            ran_outside = sum(n for (l, _, _), n in aten.items() if l == label)
            if ran_outside:
                problems.append(f"site {label} (TE Linear): {ran_outside} GEMM(s) ran outside TE (aten)")
        for k in range(passes + 1):
            for role in (("fprop",) if k == 0 else ("dgrad", "wgrad")):
                if role == "wgrad" and (label, k) in judged:
                    continue
                want = 1 if k == 0 or role in roles else 0
                got = tex[(label, k, role)] + aten[(label, k, role)]
                got_flops, want_flops = other["flops"][(label, k, role)], want * site.gemm_flops()
                if got_flops != want_flops:
                    why = f" ({_why(role)})" if k and role not in roles else ""
                    where = "forward" if k == 0 else f"backward pass {k}"
                    problems.append(f"site {label}{why}: {got} {role} GEMM{'s' if got != 1 else ''} in {where}, "
                                    f"{want} required (FLOPs {got_flops:,} vs {want_flops:,} required)")
    stray = sorted({l for (l, _, _) in tex | aten} - {s.label for s in sites(spec)})
    problems += [f"GEMMs of {l}, which is no linear site" for l in stray]
    site_flops = sum(f for site, _, _, f in tex_events if site != "?") + sum(
        e.flops for e in record.observations.get("aten_gemm_events", []) if not outside_sites(e))
    required = required_flops(spec) if passes == spec.replays else None
    figures = {"te_family_gemms_compared": sum(tex.values()) + sum(aten.values()),
               "tex_gemms_te_sites": sum(n for (l, _, _), n in tex.items() if l in te),
               "tex_wgrads_te_sites": sum(n for (l, _, r), n in tex.items() if l in te and r == "wgrad"),
               "aten_gemms_other_sites": sum(aten.values()), "te_sites": len(te),
               "gemms_outside_sites": len(other["outside"]), "flops_actual": site_flops,
               "flops_required": required,
               "flops_ratio": waste_ratio(site_flops, required) if required is not None else None}
    if problems:
        return Verdict("te_family_gemms", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict("te_family_gemms", True, figures=figures)


def te_family_waste(case_id: str, backend: str, spec: CaseSpec, record: Record) -> list[Verdict]:
    """The TE-lane family's waste verdicts (GEMMs per site); not observed when the run raised (a cut-short run has
    partial figures; `ending` says how it ended). Saved bytes and peak are the probes' figures, not judged here."""
    if record.error is not None:
        return [not_observed("te_family_gemms", case_id, backend, f"the run raised in pass {record.error_pass} "
                                                                  "(ending says how); its GEMM record is partial")]
    return [te_family_gemms(case_id, backend, spec, record)]
