"""A user's wrapper is a backend of its own (te_verify.distributed.declare): examples/user_wrapper.py runs its
declared families through the rank pool (pytest) and through torchrun, its rows and case ids under its own name and
judged by what it declares; a planted fault in a user's wrapper fails under its name; a broken declaration is a
one-line error naming it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_torchrun import run_one_node

from te_verify.distributed.declare import DeclarationError, declared_wrapper
from te_verify.matrix.dist import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples.user_wrapper:FlatAllReduceDP"
NAME = "flat_allreduce_dp"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}


def run_cases(tmp_path: Path, backends: tuple[str, ...], *files: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """The smoke cases of `files` on each of `backends`, in a pytest of their own with the checkout on the path of the
    ranks too: its process and its rows."""
    command = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "--tier", "smoke",
               *(arg for backend in backends for arg in ("--backend", backend)), "--report-dir", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    results = tmp_path / "results.json"
    return done, json.loads(results.read_text())["rows"] if results.exists() else []


@pytest.mark.system
def test_the_example_runs_its_families_in_the_pool_under_its_name(tmp_path):
    done, rows = run_cases(tmp_path, (EXAMPLE,), "cases/test_dist_ddp.py", "cases/test_dist_lora.py",
                           "cases/test_dist_fsdp.py")
    assert done.returncode == 0, done.stdout[-3000:]
    assert rows and {r["outcome"] for r in rows} == {"passed"}
    assert {r["backend"] for r in rows} == {NAME} and {r["family"] for r in rows} == {"dist_ddp", "dist_lora"}
    assert all(r["case_id"].endswith(f"-{NAME}.ws2") and f"[{NAME}-" in r["nodeid"] for r in rows)
    assert all("gradient_volume" in r["checks"] and "dist_waste_flops" in r["checks"] for r in rows)


@pytest.mark.system
def test_a_fault_in_a_users_wrapper_fails_under_its_name(tmp_path):
    done, rows = run_cases(tmp_path, ("planted_wrappers:PlantedSkippingDDP",), "cases/test_dist_ddp.py")
    assert done.returncode == 1 and rows and {r["outcome"] for r in rows} == {"failed"}
    assert {r["backend"] for r in rows} == {"planted_skipping_ddp"}
    assert all("backend planted_skipping_ddp" in r["reason"] and "grad of 0.weight" in r["reason"] for r in rows)


@pytest.mark.system
def test_the_example_runs_under_torchrun_under_its_name(tmp_path):
    proc, rows = run_one_node(tmp_path, "--wrap", EXAMPLE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    expected = {s.id.removesuffix("ddp.ws2") + f"{NAME}.ws2" for s in FAMILIES["dist_ddp"]("smoke")}
    assert {r["case_id"] for r in rows} == expected and {r["outcome"] for r in rows} == {"passed"}
    assert {r["backend"] for r in rows} == {NAME} and all(r["nodeid"].startswith(f"torchrun::{NAME}-") for r in rows)


@pytest.mark.parametrize("path, message", [
    ("planted_wrappers:UndeclaredSharding", "'planted_wrappers:UndeclaredSharding': not a wrapper declaration, it "
                                            "lacks shards"),
])
def test_a_broken_declaration_is_a_one_line_error(path, message):
    with pytest.raises(DeclarationError, match=message) as info:
        declared_wrapper(path)
    assert "\n" not in str(info.value)


def test_a_declaration_may_not_take_a_built_in_name(monkeypatch):
    import planted_wrappers

    monkeypatch.setattr(planted_wrappers.PlantedSkippingDDP, "name", "fsdp")
    with pytest.raises(DeclarationError, match=r"name='fsdp': a new identifier, not a built-in wrapper's name"):
        declared_wrapper("planted_wrappers:PlantedSkippingDDP")


@pytest.mark.system
def test_torchrun_refuses_a_bare_function_in_one_line(tmp_path):
    proc, _ = run_one_node(tmp_path, "--wrap", "planted_wrappers:ddp_skipping_first_weight")
    assert proc.returncode != 0  # the ranks exit 2; torchrun reports a child's failure as 1
    assert "--wrap 'planted_wrappers:ddp_skipping_first_weight': not a wrapper declaration" in proc.stderr
