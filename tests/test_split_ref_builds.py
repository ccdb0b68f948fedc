"""Pure-PyTorch TE builds measured below aten (te_verify.te.reference as a user's --te-impl module, its GEMMs issued
another way by planted_ref_gemms): split along K over slices of the operands and their FP8 copies with fp32 partial
sums, split along N, over transposed copies. Each spends every layer's FLOPs once, so every TE-lane case gets the
unsplit build's outcome and the same verdict of every check (attribution through views and slices of copies:
probes.storage_keys root_view, probes.weight_axes); a build running every GEMM's first half once more fails gemm work
naming the layer and role."""
from __future__ import annotations

import json

import pytest
from proof_tier import PROOF_TIER, PROOF_WORKERS
from test_plugin import run_pytest

# Every test runs the TE lane in another process: the system tests' (scripts/system_tests.sh).
pytestmark = pytest.mark.system

REFERENCE = "te_verify.te.reference"
BUILDS = ("split_k_ref_build", "split_n_ref_build", "transposed_ref_build")


def _te_lane(folder, te_impl: str, *args: str) -> dict[str, dict]:
    run_pytest("cases", "--tier", PROOF_TIER, "--backend", "te_eager", "--te-impl", te_impl, "-n", PROOF_WORKERS,
               "--report-dir", str(folder), *args)
    return {r["nodeid"]: r for r in json.loads((folder / "results.json").read_text())["rows"]}


def _verdicts(rows: dict[str, dict]) -> dict[str, tuple]:
    return {k: (r["outcome"], r.get("checks")) for k, r in rows.items()}


@pytest.fixture(scope="module")
def reference_lane(tmp_path_factory) -> dict[str, dict]:
    return _te_lane(tmp_path_factory.mktemp("reference"), REFERENCE)


@pytest.mark.parametrize("build", BUILDS)
def test_a_split_reference_build_gets_the_reference_s_outcome_on_every_te_lane_case(build, reference_lane, tmp_path):
    """The whole TE lane (the proof tier, tests/proof_tier.py) over the build and over the unsplit reference: per case
    the same outcome and the same verdict of every check, and more aten GEMMs for the split builds."""
    rows = _te_lane(tmp_path, build)
    assert rows.keys() == reference_lane.keys() and rows
    assert _verdicts(rows) == _verdicts(reference_lane)
    assert any(r["outcome"] == "passed" for r in rows.values())
    gemms = [sum((r["figures"] or {}).get("gemm_count", 0) for r in lane.values()) for lane in (rows, reference_lane)]
    assert gemms[0] >= gemms[1] > 0, gemms


def test_a_build_running_each_first_half_twice_fails_naming_layer_and_role(tmp_path):
    """Every GEMM's first half of K once more, through the same slices of the operands and their FP8 copies: each
    layer's FLOPs 1.5x its required, named per layer and role (the smoke tier's te_peft cases)."""
    rows = _te_lane(tmp_path, "split_k_extra_ref_build", "-k", "test_te_peft")
    failed = [r for r in rows.values() if r["outcome"] == "failed"]
    assert failed and all(r["checks"].get("gemm_work") == "failed" for r in failed), \
        [(r["nodeid"], r.get("checks")) for r in failed]
    assert all("layer 0: 3 fprop GEMMs, 1 required (FLOPs 98,304 vs 65,536 required)" in r["reason"]
               for r in failed), [r["reason"] for r in failed]
