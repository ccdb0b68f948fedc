"""Which FP8 copies a TE run kept for backward, by layer: autograd's saved storages (probes.saved) joined with
the tex record's provenance (probes.tex_gemm), both measured below TE's Python.

A saved storage that is a buffer of a quantized copy (rowwise data, columnwise data or its scale_inv) belongs to
the copy's source: a parameter (the layer's weight copy, needed iff its dgrad is) or an activation (the layer's
input copy, needed iff its wgrad is). What backward needs of one copy is one layout (sm90: the columnwise copy
for both dgrad "NN" and wgrad "NT"; sm100: the rowwise data) and its 4-byte scale_inv: oracle.fp8_copy_bytes.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from te_verify.checks.verdict import Verdict
from te_verify.oracle import fp8_copy_bytes, sites
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


def saved_fp8_copies(record: Record) -> list[SavedCopy] | None:
    """The FP8 copies among the run's new saved storages; None without both records."""
    obs = record.observations
    if "tex_record" not in obs or "saved_items" not in obs:
        return None
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


def fp8_copies(case_id: str, backend: str, spec: CaseSpec, record: Record) -> Verdict:
    """Every layer kept exactly the FP8 copies its backward GEMMs read: an input copy iff its wgrad is required,
    a weight copy iff its dgrad is, one layout each (oracle.fp8_copy_bytes)."""
    copies = saved_fp8_copies(record)
    if copies is None:
        return Verdict("fp8_copies", False, f"[{case_id}] backend {backend}: no tex record or saved-tensor record")
    got = {(c.layer, c.kind): c for c in copies}
    problems = []
    for site in sites(spec):
        layer, roles = site.label, site.roles()
        for kind, role in (("input", "wgrad"), ("weight", "dgrad")):
            want = fp8_copy_bytes(site, kind) if role in roles else 0
            have = got.pop((layer, kind), None)
            if (have.nbytes if have else 0) != want:
                why = "" if role in roles else f" ({role} not needed)"
                saved = f"{have.nbytes:,} B in {have.buffers} buffers" if have else "nothing"
                problems.append(f"layer {layer}{why}: saved {kind} FP8 copy: {saved}, {want:,} B required")
    problems += [f"layer {c.layer}: saved {c.kind} FP8 copy of unknown use ({c.nbytes:,} B)" for c in got.values()]
    figures = {"fp8_copies_saved_bytes": sum(c.nbytes for c in copies), "fp8_copies_saved": len(copies)}
    if problems:
        return Verdict("fp8_copies", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict("fp8_copies", True, figures=figures)
