"""Minimal work of the TE lane, against te_verify.oracle.required: per layer and role the FLOPs and operand bytes of exactly
the required GEMMs (fprop always; dgrad iff the layer's input needs a gradient; wgrad iff the weight is trainable;
per backward pass), however many GEMMs spent them (split-K), the saved-for-backward bytes, and which FP8 copies
were kept. Pure functions of records.

Sources, all below the implementation under test: the GEMMs come from the tex record (probes.tex_gemm, TE's
Python over real or emulated tex) or, for a pure-PyTorch --te-impl, from the aten GEMMs it dispatches
(probes.flops); saved bytes from autograd's saved-tensor hooks (probes.saved); FP8 copies by joining the tex record
with them (checks.fp8_copies). The reference's own GEMM log is a second source: `gemm_sources_agree` holds it to
the aten count, and its saved-copy events name the layer of a surplus.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from te_verify.oracle.copy_bytes import BLOCK_FORMAT
from te_verify.checks.fp8_copies import copies_made, fp8_copies, saved_fp8_copies
from te_verify.checks.verdict import Verdict, not_observed, waste_ratio
from te_verify.checks.waste import by_role
from te_verify.oracle.recompute import checkpoint_inputs, recomputed_labels, recomputed_sites
from te_verify.oracle.required import (RequiredSaved, graph_exists, operand_bytes, required_flops, required_roles,
                                      required_saved, sites)
from te_verify.record import Record
from te_verify.spec import CaseSpec

UNKNOWN = "unknown"
# TE's non-reentrant checkpoint (distributed.py _checkpoint_hook) is the innermost saved_tensors_hooks of its region:
# every save there becomes an index into TE's own frame and the block's input stays in its closure, so the saved
# probe sees nothing of the region (measured: 0 B saved where the block input is required).
TE_FRAME = ("TE's non-reentrant checkpoint keeps its region's saves in its own frame (its pack hook replaces every "
            "saved tensor by an index), out of the saved-tensor probe's sight")


def _why(role: str) -> str:
    return {"wgrad": "frozen weight", "bgrad": "frozen bias", "dgrad": "input needs no grad"}.get(role, role)


def _work_by_site(events: list) -> tuple[Counter, Counter, Counter | None]:
    """(GEMM counts, FLOPs, operand bytes) by (layer, role); bytes None where a source does not measure them (aten)."""
    count, flops, read = Counter(), Counter(), Counter()
    for e in events:
        count[(e.layer, e.role)] += 1
        flops[(e.layer, e.role)] += e.flops
        read[(e.layer, e.role)] += getattr(e, "operand_bytes", 0)
    return count, flops, read if all(hasattr(e, "operand_bytes") for e in events) else None


def tied_labels(spec: CaseSpec) -> dict[str, str]:
    """The sites sharing a tied weight (TEConfig.tied), each label -> the first's: provenance names the Parameter's
    layer for all their GEMMs, so they are judged together."""
    tied = spec.te.tied if spec.te is not None else ()
    labels = {site.layer: site.label for site in sites(spec)}
    return {labels[k]: labels[tied[0]] for k in tied} if tied else {}


def _required_work(spec: CaseSpec, passes: int, measured: tuple[str, ...]) -> dict[tuple[str, str], tuple]:
    """(label, role) -> (GEMMs, FLOPs, operand bytes, why not required) the required GEMMs spend; tied sites summed
    under the first's label."""
    group, want = tied_labels(spec), {}
    # Activation recompute: a checkpointed TE module reruns its whole forward in each backward pass (TE's Linear is an
    # autograd.Function that saves after its GEMM, so torch's early stop never skips it): one fprop more per pass.
    recomputed = {s.label for s in recomputed_sites(spec, sites(spec))}
    for site in sites(spec):
        roles, layer = site.roles(), group.get(site.label, site.label)
        for role in ("fprop", *measured):
            n = (1 + passes * (site.label in recomputed)) if role == "fprop" else (passes if role in roles else 0)
            nbytes = 0 if role == "bgrad" else n * operand_bytes(spec, site, role)
            why = f" ({_why(role)})" if role != "fprop" and role not in roles else ""
            old = want.get((layer, role), (0, 0, 0, why))
            want[(layer, role)] = (old[0] + n, old[1] + n * site.gemm_flops() * (role != "bgrad"), old[2] + nbytes,
                                   old[3])
    return want


def work_problems(spec: CaseSpec, events: list, passes: int) -> list[str]:
    """Per site and role, the FLOPs (and at the tex boundary the operand bytes) spent against what the required GEMMs
    need: fprop once, dgrad/wgrad once per backward pass where required. How many GEMMs spent them is a figure, so
    split-K passes; more is waste, fewer a missing GEMM. A bias gradient the reference logs is counted by events.
    A site in a checkpointed block whose backward runs (oracle.recompute) needs its fprop once more per pass."""
    count, flops, read = _work_by_site(events)
    # The reference logs its bias reductions; at the tex boundary a bias gradient is a GEMM epilogue, not an event.
    measured = ("dgrad", "wgrad", "bgrad") if any(e.role == "bgrad" for e in events) else ("dgrad", "wgrad")
    unattributed = sum(e.layer == "?" for e in events)
    problems = [f"{unattributed} GEMM(s) not attributable to a layer"] if unattributed else []
    tied = set(tied_labels(spec).values())
    for (layer, role), (want, want_flops, want_bytes, why) in _required_work(spec, passes, measured).items():
        got = count[(layer, role)]
        label = f"layer {layer}" + (" (tied weight)" if layer in tied else "") + why
        line = f"{label}: {got} {role} GEMM{'s' if got != 1 else ''}, {want} required"
        if role == "bgrad":
            problems += [line] if got != want else []
            continue
        spent = flops[(layer, role)]
        figures = [f"FLOPs {spent:,} vs {want_flops:,}"] if spent != want_flops else []
        if read is not None and read[(layer, role)] != want_bytes:
            figures.append(f"operand bytes {read[(layer, role)]:,} vs {want_bytes:,}")
        if figures:
            problems.append(f"{line} ({', '.join(figures)} required)")
    return problems


def flops_figures(spec: CaseSpec, events: list, pairs: int = 1) -> dict[str, Any]:
    """flops_actual (GEMMs; the reference's bgrad reductions excluded), flops_required (of `pairs` forward and
    backward runs of `spec`: a microbatch family's) and their ratio, and the GEMMs and FLOPs by role."""
    gemms = [e for e in events if e.role != "bgrad"]
    actual, required = sum(e.flops for e in gemms), pairs * required_flops(spec)
    by_role: Counter = Counter()
    for e in gemms:
        by_role[e.role] += e.flops
    return {"flops_actual": actual, "flops_required": required, "flops_ratio": waste_ratio(actual, required),
            "gemms_compared": len(gemms), "gemms_by_role": dict(sorted(Counter(e.role for e in gemms).items())),
            "flops_by_role": dict(sorted(by_role.items()))}


@dataclass(frozen=True)
class SiteGemm:
    """An aten GEMM (probes.flops) seen as a site's: its layer label ("?" when unattributed), role and FLOPs, and the
    index of the pass it ran in (a microbatch's, where a runner labels them: run.microbatch)."""

    layer: str
    role: str
    flops: int
    pass_index: int = 0


def measured_gemms(spec: CaseSpec, record: Record) -> list | None:
    """The run's GEMMs from the source below the implementation: the tex record, else aten's (whose layer indices
    count the model's linear weights in order, which is the order of the oracle's sites)."""
    if "gemm_log" in record.observations:
        return record.observations["gemm_log"]
    if "gemm_events" in record.observations:
        labels = [site.label for site in sites(spec)]
        return [SiteGemm("?" if e.layer is None or e.layer >= len(labels) else labels[e.layer], e.role, e.flops,
                         e.pass_index) for e in record.observations["gemm_events"]]
    return None


def gemm_sources_agree(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """The implementation's own GEMM log (the reference's) names the GEMMs aten saw: the same count per role, and
    per (layer, role) where aten could attribute them."""
    logged = Counter((e.layer, e.role) for e in record.observations["reference_gemm_log"] if e.role != "bgrad")
    measured = Counter((e.layer, e.role) for e in measured_gemms(spec, record) or [])
    logged_roles = by_role(logged)
    measured_roles = by_role(measured)
    attributed = {k: n for k, n in measured.items() if k[0] != "?"}
    problems = [f"{role}: the log has {logged_roles[role]}, aten ran {measured_roles[role]}"
                for role in sorted(set(logged_roles) | set(measured_roles)) if logged_roles[role] != measured_roles[role]]
    problems += [f"layer {layer} {role}: the log has {logged[(layer, role)]}, aten ran {n}"
                 for (layer, role), n in sorted(attributed.items()) if logged[(layer, role)] != n]
    figures = {"gemm_sources_compared": sum(measured.values())}
    if problems:
        return Verdict("gemm_sources_agree", False, f"[{case_id}] backend {backend}: the implementation's GEMM log "
                                                    f"disagrees with the GEMMs it dispatched: " + "; ".join(problems),
                       figures)
    return Verdict("gemm_sources_agree", True, figures=figures)


def unmeasured_calls(record: Record) -> list[str]:
    """TE's grouped-tensor path (real TE on sm90+): tex calls whose GEMMs the counts miss, said first."""
    unmeasured = sorted(set(getattr(record.observations.get("tex_record"), "unmeasured", [])))
    return [f"TE called tex.{', tex.'.join(unmeasured)}, whose GEMMs the tex record does not measure per group; the "
            f"GEMM counts are incomplete"] if unmeasured else []


def gemm_work(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """Each layer spends the FLOPs (and at the tex boundary reads the operand bytes) of exactly the required GEMMs:
    one fprop in the forward, per backward pass a dgrad and a wgrad where required (work_problems)."""
    events = measured_gemms(spec, record)
    if events is None:
        return Verdict("gemm_work", False, f"[{case_id}] backend {backend}: no GEMM record (run without its probe?)")
    problems = unmeasured_calls(record) + work_problems(spec, events, record.passes_done)
    figures = flops_figures(spec, events)
    if record.error is None and figures["flops_actual"] != figures["flops_required"]:
        problems.append(f"FLOPs {figures['flops_actual']:,} vs {figures['flops_required']:,} required "
                        f"(ratio {figures['flops_ratio']})")
    if problems:
        return Verdict("gemm_work", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict("gemm_work", True, figures=figures)


def saved_copies(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """The reference's own saved-copy events: input copy iff wgrad is required, weight copy iff dgrad is."""
    saved = record.observations["te_saved"]
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
    figures = {"te_saved_copy_bytes": sum(e.bytes for e in saved), "te_saved_copy_count": len(saved),
               "saved_copies_compared": len(saved)}
    if problems:
        return Verdict("saved_copies", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict("saved_copies", True, figures=figures)


def _unaccounted(record: Record) -> list[str]:
    """The new saved storages (under TE's Python) that are no FP8 copy's buffer and no layer's input, by dtype and
    shape: what neither the copy record nor the oracle's inputs name (GroupedLinear's bf16 bias casts, say)."""
    obs = record.observations
    if "tex_record" not in obs or "saved_items" not in obs:
        return []
    named = {key[0] for key in obs["tex_record"].provenance} | {root[0] for root in obs.get("input_layers", {})}
    named |= {root[0] for root in obs.get("param_layers", {})}  # cast copies of a weight (autocast): _cast_copies
    kept = {item.key: item for item in obs["saved_items"]
            if item.new and item.key not in named and not (item.root and item.root[0] in named)}
    if not kept:
        return []
    kinds = Counter(f"{item.dtype.removeprefix('torch.')}{list(item.shape)}" for item in kept.values())
    return [f"saved storages no FP8 copy or layer input accounts for: "
            f"{', '.join(f'{n} x {kind}' for kind, n in sorted(kinds.items()))} "
            f"({sum(item.storage_bytes for item in kept.values()):,} B)"]


def _cast_copies(spec: CaseSpec, record: Record) -> list[str]:
    """Under autocast: each saved cast copy of a weight beyond the one its layer's dgrad needs (a torch op's copy,
    followed back to the Parameter), naming the layer."""
    layers = record.observations.get("param_layers", {})
    required, seen, lines = required_roles(spec), Counter(), []
    for item in record.observations.get("saved_items", []):
        layer = layers.get(item.root) if item.new and item.root else None
        if layer is None or item.key in seen:
            continue
        seen[item.key] += 1
        seen[layer] += 1
        allowed = int("dgrad" in required.get(layer, set()))
        if seen[layer] > allowed:
            lines.append(f"layer {layer} (dgrad {'needed' if allowed else 'not needed'}): saved a {item.dtype} copy "
                         f"of its weight {list(item.shape)} {item.storage_bytes:,} B, {allowed} required")
    return lines


def _checkpointed_inputs(spec: CaseSpec, record: Record) -> list[str]:
    """Under recompute: each saved input of a layer inside a checkpointed block other than the block's input (which
    is what the forward keeps; the rest is recomputed in backward), naming the layer."""
    if spec.recompute == "none":
        return []
    inside = recomputed_labels(spec, sites(spec)) - {s.label for s in checkpoint_inputs(spec, sites(spec))}
    layers = {root[0]: layer for root, layer in record.observations.get("input_layers", {}).items()}
    seen, lines = set(), []
    for item in record.observations.get("saved_items", []):
        layer = layers.get(item.key) if item.new else None
        if layer in inside and item.key not in seen:
            seen.add(item.key)
            lines.append(f"layer {layer} (checkpointed: recomputed in backward): saved its input {list(item.shape)} "
                         f"{item.storage_bytes:,} B, 0 required")
    return lines


def _surplus(spec: CaseSpec, record: Record) -> list[str]:
    """What explains a saved-bytes surplus: the FP8 copy check by site, or the reference's own copy events; then the
    saved storages neither names (_unaccounted)."""
    checkpointed = _checkpointed_inputs(spec, record)
    if saved_fp8_copies(spec, record):
        return [*checkpointed, "the FP8 copies kept, by site, are in the fp8_copies check", *_unaccounted(record)]
    required = required_roles(spec)
    events = [f"layer {e.layer} ({role} not needed): saved {e.kind} copy ({e.bytes:,} B)"
              for e in record.observations.get("te_saved", [])
              if (role := "wgrad" if e.kind == "input" else "dgrad") not in required.get(e.layer, set())]
    return checkpointed + events + _cast_copies(spec, record) + _unaccounted(record)


def saved_bytes(case_id: str, backend: str, spec: CaseSpec, record: Record,
                need: RequiredSaved | None = None) -> Verdict:
    """Saved-for-backward bytes and count (new storages, te_verify.probes.saved) equal the oracle's (or `need`, what a
    microbatch iteration requires: checks.te_accumulation), exactly."""
    need = need or required_saved(spec)
    figures: dict[str, Any] = {"saved_bytes_required": need.nbytes, "saved_count_required": need.count}
    if spec.recompute == "te_nonreentrant":
        return not_observed("te_saved_bytes", case_id, backend, TE_FRAME, figures, blocked_by=None)
    if "saved_count_raw" not in record.figures:
        figures.update(saved_bytes_actual=UNKNOWN, saved_count_actual=UNKNOWN, saved_bytes_ratio=UNKNOWN)
        return Verdict("te_saved_bytes", False, f"[{case_id}] backend {backend}: no saved-tensor figures "
                                                f"(run without SavedTensorsProbe?)", figures)
    actual, count = record.figures["saved_bytes_actual"], record.figures["saved_count_actual"]
    figures.update(saved_bytes_actual=actual, saved_count_actual=count, saved_bytes_ratio=waste_ratio(actual, need.nbytes),
                   saved_compared=record.figures.get("saved_count_raw", count))
    if (actual, count) == (need.nbytes, need.count):
        return Verdict("te_saved_bytes", True, figures=figures)
    named = _surplus(spec, record) or ["no copy record names the surplus"]
    return Verdict("te_saved_bytes", False, f"[{case_id}] backend {backend}: saved-for-backward {actual:,} B in {count} "
                                            f"tensors vs {need.nbytes:,} B in {need.count} required (ratio "
                                            f"{figures['saved_bytes_ratio']}); " + "; ".join(named), figures)


def _unknown_figures(spec: CaseSpec, why: str) -> dict[str, Any]:
    need = required_saved(spec)
    figures = {"flops_required": required_flops(spec), "saved_bytes_required": need.nbytes,
               "saved_count_required": need.count, "waste_skipped": why}
    figures.update({k: UNKNOWN for k in ("flops_actual", "flops_ratio", "saved_bytes_actual", "saved_bytes_ratio",
                                         "saved_count_actual")})
    return figures


def _skipped(spec: CaseSpec, why: str) -> list[Verdict]:
    """Not applicable to the case (`why`: e.g. TE must refuse the FP8 shape, which another check judges)."""
    return [Verdict("te_waste", True, figures={**_unknown_figures(spec, why), "te_waste_compared": "not applicable"})]


def te_waste(case_id: str, backend: str, spec: CaseSpec, record: Record, skip: str | None = None) -> list[Verdict]:
    """The TE lane's waste verdicts: GEMMs by layer and role, FLOPs, saved bytes, and the FP8 copies kept.

    Not applicable (actual figures "unknown", reason in `waste_skipped`) when `skip` says why; not observed when
    the run raised before eager's does (a cut-short run has partial figures; `ending` says how it ended).
    """
    # Where no graph exists eager's backward raises too, after a complete forward: only a forward raise cuts it short.
    if skip is None and record.error is not None and (graph_exists(spec) or record.error_pass == 0):
        why = f"the run raised in pass {record.error_pass} (ending says how); its figures are partial"
        checks = ("gemm_work", "te_saved_bytes") + (("fp8_copies",) if spec.te is not None and spec.te.recipe else ())
        checks += ("fp8_copies_made",) if spec.te is not None and spec.te.recipe in BLOCK_FORMAT else ()
        return [not_observed(c, case_id, backend, why, figures) for c, figures in
                zip(checks, [_unknown_figures(spec, why)] + [{}] * len(checks))]
    if skip is not None:
        return _skipped(spec, skip)
    verdicts = [gemm_work(case_id, backend, spec, record), saved_bytes(case_id, backend, spec, record)]
    if "reference_gemm_log" in record.observations:
        verdicts.append(gemm_sources_agree(case_id, backend, spec, record))
    if "te_saved" in record.observations:
        verdicts.append(saved_copies(case_id, backend, spec, record))
    elif spec.te is not None and spec.te.recipe is not None:
        verdicts.append(fp8_copies(case_id, backend, spec, record))
    if spec.te is not None and spec.te.recipe in BLOCK_FORMAT and "tex_record" in record.observations:
        verdicts.append(copies_made(case_id, backend, spec, record))
    return verdicts
