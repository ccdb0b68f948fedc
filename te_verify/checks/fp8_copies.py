"""Which FP8 copies a TE run kept for backward, by layer: autograd's saved storages (probes.saved) joined with
the tex record's provenance (probes.tex_gemm), both measured below TE's Python; for a pure-PyTorch --te-impl,
the saved storages the aten watcher traced through casts to a weight or a layer input.

A saved storage that is a buffer of a quantized copy (rowwise data, columnwise data or its scale_inv) belongs to
the copy's source: a parameter (the layer's weight copy, needed iff its dgrad is) or an activation (the layer's
input copy, needed iff its wgrad is). What backward needs of one copy is one layout (sm90: the columnwise copy
for both dgrad "NN" and wgrad "NT"; sm100: the rowwise data) and its 4-byte scale_inv: oracle.fp8_copy_bytes.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from te_verify.checks.verdict import Verdict, not_observed
from te_verify.oracle.recompute import recomputed_labels
from te_verify.oracle.required import SCALE_INV_BYTES, fp8_copy_bytes, sites
from te_verify.record import Record
from te_verify.spec import CaseSpec


@dataclass(frozen=True)
class SavedCopy:
    """The saved buffers of one FP8 copy."""

    # Layer label ("?" when the source is not known).
    layer: str
    # "weight" (for dgrad) or "input" (for wgrad).
    kind: str
    # Number of saved storages (data, transpose, scale_inv) and their bytes.
    buffers: int
    nbytes: int


def saved_fp8_copies(spec: CaseSpec, record: Record) -> list[SavedCopy] | None:
    """The FP8 copies among the run's new saved storages: from the tex record's provenance under TE's Python,
    else from the copies the aten watcher followed (a pure-PyTorch --te-impl); None without either."""
    obs = record.observations
    if "saved_items" not in obs:
        return None
    if "tex_record" in obs:
        return _tex_copies(obs)
    if obs.get("copies_followed"):
        return _aten_copies(spec, obs)
    return None


def _tex_copies(obs: dict) -> list[SavedCopy]:
    by_storage = {key[0]: source for key, source in obs["tex_record"].provenance.items()}
    copies: dict[tuple[str, str], list[int]] = defaultdict(list)
    seen = set()
    for item in obs["saved_items"]:
        if not item.new or item.key in seen or item.key not in by_storage:
            continue
        seen.add(item.key)
        source = by_storage[item.key]
        if source in obs["param_layers"]:
            copies[(obs["param_layers"][source], "weight")].append(item.storage_bytes)
        else:
            copies[(obs["input_layers"].get(source, "?"), "input")].append(item.storage_bytes)
    return [SavedCopy(layer, kind, len(sizes), sum(sizes)) for (layer, kind), sizes in sorted(copies.items())]


def _aten_copies(spec: CaseSpec, obs: dict) -> list[SavedCopy]:
    """Copies traced to their weight or input through the casts that made them. A scale_inv is computed from an
    amax (a reduction, not a copy), so it cannot be traced: each copy is credited its 4-byte scale_inv."""
    labels = [site.label for site in sites(spec)]
    copies: dict[tuple[str, str], list[int]] = defaultdict(list)
    for a in obs["saved_storages"]:
        if a.kind in ("weight_copy", "input_copy") and a.layer is not None:
            label = labels[a.layer] if a.layer < len(labels) else "?"
            copies[(label, a.kind.removesuffix("_copy"))].append(a.nbytes)
    return [SavedCopy(layer, kind, len(sizes) + 1, sum(sizes) + SCALE_INV_BYTES)
            for (layer, kind), sizes in sorted(copies.items())]


def fp8_copies(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """Every layer kept exactly the FP8 copies its backward GEMMs read: an input copy iff its wgrad is required,
    a weight copy iff its dgrad is, one layout each (oracle.fp8_copy_bytes); none for a site in a checkpointed block."""
    copies = saved_fp8_copies(spec, record)
    if copies is None:
        return Verdict("fp8_copies", False, f"[{case_id}] backend {backend}: no record of the copies saved (tex "
                                              f"record, or aten copies followed, with saved tensors)")
    got = {(c.layer, c.kind): c for c in copies}
    problems = []
    # A site in a checkpointed block keeps nothing from the forward: its recompute in backward makes what it reads.
    recomputed = recomputed_labels(spec, sites(spec))
    for site in sites(spec):
        layer, roles = site.label, site.roles()
        for kind, role in (("input", "wgrad"), ("weight", "dgrad")):
            want = fp8_copy_bytes(site, kind, spec.te.recipe) if role in roles and layer not in recomputed else 0
            have = got.pop((layer, kind), None)
            if (have.nbytes if have else 0) != want:
                why = (f" ({role} not needed)" if role not in roles
                       else " (checkpointed: recomputed in backward)" if layer in recomputed else "")
                saved = f"{have.nbytes:,} B in {have.buffers} buffers" if have else "nothing"
                problems.append(f"layer {layer}{why}: saved {kind} FP8 copy: {saved}, {want:,} B required")
    problems += [f"layer {c.layer}: saved {c.kind} FP8 copy of unknown use ({c.nbytes:,} B)" for c in got.values()]
    figures = {"fp8_copies_saved_bytes": sum(c.nbytes for c in copies), "fp8_copies_saved": len(copies),
               "fp8_copies_compared": 2 * len(sites(spec))}  # an input and a weight copy per site
    if problems:
        return Verdict("fp8_copies", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict("fp8_copies", True, figures=figures)


# The GEMM that reads each role's columnwise layout: dgrad a weight's, wgrad an input's and a grad_output's.
COLUMNWISE_READER = {"weight": "dgrad", "input": "wgrad", "grad_output": "wgrad"}


def _owners(obs: dict) -> dict:
    """Provenance root -> (layer, role): parameters by name, activations by the fprop that read them, gradients by
    the backward GEMM that read them as its B operand (dy in dgrad "NN" and wgrad "NT")."""
    owners = {root: (layer, "weight") for root, layer in obs["param_layers"].items()}
    for root, layer in obs.get("input_layers", {}).items():
        owners.setdefault(root, (layer, "input"))
    for event in obs.get("gemm_log", []):
        if event.role in ("dgrad", "wgrad") and event.layer != "?" and event.gemm.b_root is not None:
            owners.setdefault(event.gemm.b_root, (event.layer, "grad_output"))
    return owners


def _owner(owners: dict, seen) -> tuple[str, str]:
    """A copy's (layer, role); one of no known source made in backward is a gradient no GEMM attributed (TE
    quantizes grad_output there even where no backward GEMM reads it): ("?", "grad_output")."""
    if seen.source in owners:
        return owners[seen.source]
    return ("?", "grad_output") if seen.phase == "backward" else ("?", "?")


def made_copies(obs: dict) -> dict[tuple[str, str], dict]:
    """(layer, role) -> {"layouts": layout -> largest bytes one copy held, "read_by": sorted "role:layout"} over
    every quantized copy of the run (tex_record.copies); unattributed copies under layer "?" (_owner)."""
    owners, found = _owners(obs), {}
    for seen in obs["tex_record"].copies.values():
        entry = found.setdefault(_owner(owners, seen), {"layouts": {}, "read_by": set()})
        for layout, nbytes in seen.layouts.items():
            entry["layouts"][layout] = max(entry["layouts"].get(layout, 0), nbytes)
        entry["read_by"] |= {f"{role}:{layout}" for role, layout in seen.read_by}
    return {key: {"layouts": v["layouts"], "read_by": sorted(v["read_by"])} for key, v in found.items()}


def copies_made(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """fp8_copies_made (block-scaled recipes): a layer's weight, input or grad_output has a columnwise copy only
    where a GEMM the case needs reads it (a weight's for dgrad; an input's and a grad_output's for wgrad): a frozen
    weight whose input needs no gradient needs none, nor does the grad_output of a layer whose weight does not
    train. Measured on every copy the run made (quantize outputs, GEMM operands), not only those saved. With no copy
    attributed it is not observed, unless the record shows nothing was quantized where nothing needed it
    (_nothing_quantized)."""
    obs = record.observations
    if "tex_record" not in obs:
        return not_observed("fp8_copies_made", case_id, backend, "no tex record of the quantized copies",
                            blocked_by=None)
    roles: dict[str, set[str]] = defaultdict(set)
    for site in sites(spec):
        roles[site.label] |= site.roles()
    made, problems = made_copies(obs), []
    for (layer, role), entry in sorted(made.items()):
        col = entry["layouts"].get("columnwise")
        if layer in roles and col and COLUMNWISE_READER[role] not in roles[layer]:
            problems.append(f"layer {layer}: {role} has a columnwise copy ({col:,} B) that no required GEMM reads "
                            f"({COLUMNWISE_READER[role]} not needed; read by {', '.join(entry['read_by']) or 'none'})")
        elif (layer, role) == ("?", "grad_output") and col and not any(r.endswith(":columnwise")
                                                                        for r in entry["read_by"]):
            # No GEMM read it, so no layer's wgrad: made for nothing, whichever layer's it is.
            problems.append(f"layer ?: grad_output has a columnwise copy ({col:,} B) that no GEMM reads (no "
                            f"backward GEMM read this gradient, so its layer is not known)")
    figures = {"fp8_copies_made": {f"{layer}/{role}": entry for (layer, role), entry in sorted(made.items())},
               "fp8_copies_made_compared": sum(layer in roles for layer, _ in made)}
    if problems:  # an unattributed gradient copy no GEMM reads is a problem also where no copy is attributed
        return Verdict("fp8_copies_made", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures,
                       tuple(problems))
    if not figures["fp8_copies_made_compared"]:
        nothing = _nothing_quantized(obs, made, roles)
        if nothing is None:
            return not_observed("fp8_copies_made", case_id, backend, "no quantized copy attributed to a layer",
                                figures, blocked_by=None)
        figures["fp8_copies_made_compared"] = nothing
    return Verdict("fp8_copies_made", True, figures=figures)


def _nothing_quantized(obs: dict, made: dict, roles: dict[str, set[str]]) -> str | None:
    """The figure that makes "no copy" a measurement, or None where it is not one: no required GEMM reads a
    columnwise copy (no dgrad or wgrad anywhere), and the tex record holds the run's GEMMs, each attributed to a layer
    and none on a quantized operand, beside no quantized copy (CustomRecipe's high-precision forward makes none where
    nothing needs a gradient). Otherwise an empty record may be one that missed the copies."""
    gemms, readers = obs.get("gemm_log", []), set(COLUMNWISE_READER.values())
    if made or any(r & readers for r in roles.values()) or not gemms or \
            any(e.layer == "?" or e.gemm.fp8 for e in gemms):
        return None
    return f"nothing: no quantized copy made, and the {len(gemms)} GEMMs recorded read high-precision operands"
