"""`--te-impl package.module` (a user's TE build) serves every TE family, or skips a case naming the API it lacks;
never a harness error. te_verify.te.reference named as a module path (a pure-PyTorch build with the whole API, judged
from aten's GEMMs and autograd's saved tensors like any user's build) passes the smoke tier of every family;
tests/minimal_te_build.py (README's minimum) runs what its API serves and skips the rest naming what is missing.
Beneath a user's build the LoRA family's frozen TE bases are judged from aten's GEMMs: a discarded wgrad is named."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planted_te_lora import WastedBaseWgradTE
from te_verify.te import api as te_api
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.te_family import te_family_gemms
from te_verify.matrix.te import _lora
from te_verify.probes import default_probes
from te_verify.probes.tex_gemm import AtenGemmOutsideTex
from te_verify.run.runner import run_case

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("te_fp8", "te_peft", "te_replay", "te_contract", "te_delayed", "te_moe", "te_lora")
MINIMAL = "tests.minimal_te_build"
# What a skip of the minimal build may name: an API it lacks, FP8 it says it lacks, or a spec no TE serves.
LACKED = (r"(te\.GroupedLinear|te\.GroupedMLP|te\.LayerNormLinear|te\.LayerNormMLP|te\.ops\.\w+"
          r"|main_grad \(Linear\(fuse_wgrad_accumulation=True\)\)|Linear\.backward_dw with delay_wgrad_compute=True)")
MINIMAL_SKIPS = re.compile(rf"--te-impl tests\.minimal_te_build lacks {LACKED}(, {LACKED})* \(module kind \w+\)"
                           r"|FP8 unavailable: this build computes in high precision only"
                           r"|te\.ops\.Linear has no delay_wgrad_compute"
                           r"|activation recompute over --te-impl tests\.minimal_te_build is not built yet .*")


def _run_families(report_dir: Path, impl: str, tier: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    command = [sys.executable, "-m", "pytest", *(f"cases/test_{f}.py" for f in FAMILIES), "-q", "-p", "no:cacheprovider",
               "--tier", tier, "--backend", "te_eager", "--te-impl", impl, "--report-dir", str(report_dir)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in (report_dir / "rows.jsonl").read_text().splitlines()]
    return done, [r for r in rows if r.get("kind") == "row"]


def _by_family(rows: list[dict], outcome: str) -> dict[str, list[dict]]:
    return {f: [r for r in rows if r["family"] == f and r["outcome"] == outcome] for f in FAMILIES}


@pytest.mark.system
def test_reference_as_a_users_module_passes_every_family(tmp_path):
    done, rows = _run_families(tmp_path, "te_verify.te.reference", "smoke")
    assert done.returncode == 0, done.stdout[-3000:]
    bad = [(r["nodeid"], r.get("reason")) for r in rows if r["outcome"] not in ("passed", "skipped")]
    assert not bad, bad
    assert all(_by_family(rows, "passed").values()), {f: len(v) for f, v in _by_family(rows, "passed").items()}
    assert all("lacks" in r["reason"] for r in rows if r["outcome"] == "skipped")


@pytest.mark.system
def test_minimal_build_runs_what_it_serves_and_skips_naming_what_it_lacks(tmp_path):
    done, rows = _run_families(tmp_path, MINIMAL, "pr")
    assert done.returncode == 0, done.stdout[-3000:]
    assert {r["outcome"] for r in rows} == {"passed", "skipped"}
    unnamed = [r["reason"] for r in rows if r["outcome"] == "skipped" and not MINIMAL_SKIPS.fullmatch(r["reason"])]
    assert not unnamed, unnamed
    passed, skipped = _by_family(rows, "passed"), _by_family(rows, "skipped")
    assert passed["te_lora"] and passed["te_replay"]  # its high-precision cases run and pass
    delayed = [r["reason"] for r in skipped["te_delayed"] if not r["reason"].startswith("FP8 unavailable")]
    assert delayed and all("backward_dw" in reason for reason in delayed) and not passed["te_delayed"]
    assert any("main_grad" in r["reason"] for r in skipped["te_contract"])
    assert any("te.GroupedLinear" in r["reason"] for r in skipped["te_moe"])


@pytest.fixture
def minimal_build():
    with te_api.using(te_api.resolve("minimal_te_build")) as impl:
        yield impl


def _lora_gemms(backend):
    spec = _lora("qv", True, "fp32")
    got = run_case(spec, backend, [*default_probes("te_eager"), AtenGemmOutsideTex()])
    return te_family_gemms(spec.id, "te_eager", spec, got)


def test_a_users_lora_bases_are_judged_from_aten(minimal_build):
    verdict = _lora_gemms(TEEagerBackend())
    assert verdict.ok, verdict.message
    assert verdict.figures["te_sites"] == 2 and verdict.figures["flops_actual"] == verdict.figures["flops_required"]


def test_a_discarded_wgrad_of_a_users_frozen_base_is_named(minimal_build):
    verdict = _lora_gemms(WastedBaseWgradTE())
    assert not verdict.ok
    for site in ("blocks.0.attn.q.base", "blocks.0.attn.v.base"):
        assert f"site {site} (frozen weight): 1 wgrad GEMM in backward pass 1, 0 required" in verdict.message
