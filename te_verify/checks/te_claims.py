"""Whether thunder's TE executor claimed the linears, measured at the tex boundary (not from thunder's trace).

thunder declines some recipes (0.2.6: Float8CurrentScaling, "not supported by TE executor, TE wont be used") and
shapes, and then runs the linear with its torch executors. Such a run says nothing about TE: it must be reported
as unclaimed, with thunder's own reason (its warning), never counted as a TE pass.
"""
from __future__ import annotations

from te_verify.oracle.required import sites
from te_verify.record import Record
from te_verify.spec import CaseSpec


def thunder_reason(record: Record) -> str | None:
    """thunder's warning about the TE executor, if the run emitted one."""
    hits = [w for w in record.figures.get("warnings", []) if "TE executor" in w or "TE wont" in w]
    return hits[0] if hits else None


def unclaimed_reason(spec: CaseSpec, record: Record) -> str | None:
    """Why the run is no TE result (its forward completed, yet no linear reached TE's GEMMs), or None when some linear was
    claimed, the forward raised (a failure, judged by the checks), or it carries no tex record to tell. A microbatched
    run keeps its forwards' outputs in `outputs` (its `output` stays None)."""
    claimed = record.figures.get("te_layers_claimed")
    if claimed is None or claimed or (record.output is None and not record.outputs):
        return None
    why = thunder_reason(record)
    linears = f"{len(sites(spec))} linear sites" if spec.model is not None else f"{spec.n_layers} linears"
    return (f"thunder's TE executor claimed none of the {linears} (no TE GEMM ran); the run used "
            f"thunder's other executors, so it is not a TE result" + (f"; thunder: {why}" if why else ""))
