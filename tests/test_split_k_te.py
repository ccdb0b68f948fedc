"""Split-K at the tex boundary: a TE build issuing each GEMM as two half-K GEMMs over slices of the weights, the
activations and their FP8 copies (planted_te_gemms, `--te-impl split_k_te_build`) spends every layer's FLOPs and reads
its operand bytes once, so it passes gemm_work, fp8_copies and te_family_gemms as TE does; a TE whose every fprop
GEMM runs once more, its result thrown away, fails gemm_work naming each layer."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from planted_te_gemms import patched
from proof_tier import PROOF_TIER, PROOF_WORKERS
from test_plugin import run_pytest

from te_verify.te import api as te_api
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.fp8_copies import fp8_copies
from te_verify.checks.te_family import te_family_gemms
from te_verify.checks.te_waste import gemm_work
from te_verify.matrix.te import _lora
from te_verify.probes import default_probes
from te_verify.probes.tex_gemm import AtenGemmOutsideTex
from te_verify.run.microbatch import run_mean_reduced
from te_verify.run.runner import run_case
from te_verify.spec import CaseSpec, TEConfig

ALT = (True, False, True, False)
# 64 rows: FP8's wgrad (K = rows) splits on a multiple of 16 too.
FP8 = CaseSpec("te_peft", (32, 64, 128, 64, 32), ALT, ALT, True, (64,), te=TEConfig(recipe="delayed"))
BF16 = CaseSpec("te_peft", (32, 64, 128, 64, 32), (False,) * 4, ALT, True, (4, 16), dtype="bf16", replays=2,
                te=TEConfig(recipe=None))
LORA = _lora("qv", True, "fp32")


pytestmark = pytest.mark.usefixtures("te_python")  # TE's Python over the emulation (tests/conftest.py)


def _run(spec: CaseSpec, mode: str):
    with patched(mode):
        return run_mean_reduced(spec, TEEagerBackend(), default_probes("te_eager"))


@pytest.mark.parametrize("spec", [FP8, BF16], ids=lambda s: s.id)
def test_split_k_te_runs_two_gemms_per_layer_and_role_and_passes_as_te_does(spec):
    split, whole = _run(spec, "split_k"), _run(spec, "te")
    per_role = Counter((e.layer, e.role, e.phase) for e in split.observations["gemm_log"])
    assert set(per_role.values()) == {2}, per_role  # every GEMM split: the record saw both halves
    assert per_role.keys() == {(e.layer, e.role, e.phase) for e in whole.observations["gemm_log"]}
    for check in (gemm_work, fp8_copies) if spec.te.recipe else (gemm_work,):
        got, want = check(spec.id, "te_eager", spec, split), check(spec.id, "te_eager", spec, whole)
        assert (got.ok, got.message) == (want.ok, want.message)
    work = gemm_work(spec.id, "te_eager", spec, split)
    assert work.ok, work.message
    assert work.figures["flops_by_role"] == gemm_work(spec.id, "te_eager", spec, whole).figures["flops_by_role"]


def test_split_k_te_bases_pass_the_lora_family_check():
    with patched("split_k"):
        got = run_case(LORA, TEEagerBackend(), [*default_probes("te_eager"), AtenGemmOutsideTex()])
    verdict = te_family_gemms(LORA.id, "te_eager", LORA, got)
    assert verdict.ok, verdict.message
    assert verdict.figures["tex_gemms_te_sites"] == 8  # per base: fprop and dgrad, each in two halves


def test_a_discarded_fprop_recompute_at_the_tex_boundary_fails_naming_each_layer():
    verdict = gemm_work(FP8.id, "te_eager", FP8, _run(FP8, "recompute"))
    assert not verdict.ok
    assert ("layer 0: 2 fprop GEMMs, 1 required (FLOPs 524,288 vs 262,144, operand bytes 8,192 vs 4,096 "
            "required)") in verdict.message
    assert "layer 3: 2 fprop GEMMs, 1 required" in verdict.message


def test_fp8_gemms_run_on_dequantized_copies_fail_on_operand_bytes_alone():
    """The same FLOPs, each operand read in fp32 where the FP8 case reads one byte an element."""
    verdict = gemm_work(FP8.id, "te_eager", FP8, _run(FP8, "dequantized"))
    assert not verdict.ok
    assert "layer 0: 1 fprop GEMM, 1 required (operand bytes 16,384 vs 4,096 required)" in verdict.message
    assert "FLOPs" not in verdict.message  # every layer's FLOPs as required: the bytes alone fail it


def _te_lane(folder, te_impl: str) -> dict[str, dict]:
    # te_autocast's cases included: a slice of autocast's bf16 weight copy leads back to the weight (a copy's views
    # are rooted by its storage: probes.storage_keys root_view).
    proc = run_pytest("cases", "--tier", PROOF_TIER, "--backend", "te_eager", "--te-impl", te_impl, "-n", PROOF_WORKERS,
                      "--report-dir", str(folder))
    assert proc.returncode == 0, proc.stdout[-3000:]
    return {r["nodeid"]: r for r in json.loads((folder / "results.json").read_text())["rows"]}


@pytest.mark.system
def test_the_split_k_te_build_gets_te_s_outcome_on_every_te_lane_case(tmp_path):
    """The whole TE lane (the proof tier, tests/proof_tier.py) over `--te-impl split_k_te_build` and over TE itself:
    per case the same outcome and the same verdict of every check (known gaps failing as recorded), with more GEMMs at
    the tex boundary. The build ships the per-tensor recipes only: its block-scaled cases skip naming the recipe."""
    split = _te_lane(tmp_path / "split", "split_k_te_build")
    te = _te_lane(tmp_path / "te", te_api.CPU_CHOICE)
    assert split.keys() == te.keys()
    lacks = {k for k, r in split.items()
             if r["outcome"] == "skipped" and "this TE implementation has no" in str(r.get("reason"))}
    assert all(re.search(r"-fp8(block|mxfp8|nvfp4|custom)", k) for k in lacks), sorted(lacks)
    assert {k: (r["outcome"], r.get("checks")) for k, r in split.items() if k not in lacks} == \
        {k: (r["outcome"], r.get("checks")) for k, r in te.items() if k not in lacks}
    gemms = [sum((r["figures"] or {}).get("tex_gemm_count", 0) for r in rows.values()) for rows in (split, te)]
    assert gemms[0] > gemms[1] > 0, gemms
