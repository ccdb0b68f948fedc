"""checks.te_claims.unclaimed_reason: a run whose forward completed without any linear reaching TE's GEMMs is no
TE result (the case skips saying so), in a single run (`output`) and in a microbatched one (`outputs`, its `output`
None): at sm100, thunder 0.2.6's TE executor declines MXFP8 (TE's default recipe there) on 16-row microbatches and
runs torch's linears, whose work the TE lane's waste checks then found missing."""
from __future__ import annotations

import torch

from te_verify.checks.te_claims import unclaimed_reason
from te_verify.record import Record
from te_verify.spec import CaseSpec

SPEC = CaseSpec("te_contract", (16, 32, 16), (False, False), None)


def record(claimed: list[str] | None, output: bool = False, outputs: int = 0) -> Record:
    r = Record("thunder_te")
    if claimed is not None:
        r.figures["te_layers_claimed"] = claimed
    r.output = torch.zeros(2) if output else None
    for i in range(outputs):
        r.add_output(torch.zeros(2), f"iteration 1, microbatch {i + 1}", 1)
    return r


def test_a_single_run_without_claims_is_unclaimed() -> None:
    assert "claimed none of the 2 linears" in unclaimed_reason(SPEC, record([], output=True))


def test_a_microbatched_run_without_claims_is_unclaimed() -> None:
    assert "claimed none of the 2 linears" in unclaimed_reason(SPEC, record([], outputs=2))


def test_claims_a_raised_forward_or_no_record_judge() -> None:
    assert unclaimed_reason(SPEC, record(["0"], outputs=2)) is None, "a claimed layer is a TE result"
    assert unclaimed_reason(SPEC, record([])) is None, "a forward that raised is a failure to judge"
    assert unclaimed_reason(SPEC, record(None, outputs=2)) is None, "no tex record: nothing to tell"
