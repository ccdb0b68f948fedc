"""Saved-for-backward weighed per site value, not counted (issue 36, item 6): a correct backend running the batch as
two halves saves each value in two half-size storages, which add up to one copy and pass waste_saved; a second copy
of the same bytes (planted_lora's save_twice, tests/test_lora_planted.py) still fails."""
from __future__ import annotations

from batch_split_backend import SplitsBatch
from te_verify.matrix.models import model_spec
from te_verify.run.caserun import CaseRun
from te_verify.spec import ModelConfig

SPEC = model_spec("lora", ModelConfig(lora_on=("q", "v")), True)


def test_batch_split_in_halves_passes_waste_saved_with_eagers_bytes():
    verdicts = {v.check: v for v in CaseRun(SPEC, "splits_batch", SplitsBatch()).verify()}
    saved = verdicts["waste_saved"]
    assert saved.ok and saved.figures["saved_sites_bytes"] == 4608  # eager's: the same values, whole
    assert verdicts["waste_flops"].ok  # the same FLOPs per site and role, in twice the GEMMs
