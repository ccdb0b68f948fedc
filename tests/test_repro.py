"""Repro scripts: a planted failing case's script fails standalone with the recorded message, then passes once
the fault is removed; file names and the pytest command line are well formed."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from report_fixtures import FREEZE, results, row

from te_verify.run.caserun import CaseRun
from te_verify.report.repro import case_check, pytest_command, repro_filename, write_repros
from te_verify.spec import CaseSpec, DistConfig

ROOT = Path(__file__).resolve().parents[1]
SPEC = CaseSpec("freeze", (8, 8, 8), (False, False), (False, False))

# An external backend with a switchable planted fault: layer 1's weight gradient scaled by 1.01.
PLANTED = '''
FAULT = {fault}


class ScaledWgrad:
    name = "planted_scaled_wgrad"

    def available(self):
        return True, ""

    def prepare(self, model, spec):
        if FAULT:
            model[1].weight.register_hook(lambda g: g * 1.01)
        return model
'''


def _planted_module(directory: Path, fault: bool) -> str:
    (directory / "planted_repro.py").write_text(PLANTED.format(fault=fault))
    return "planted_repro:ScaledWgrad"


def _run(script: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(ROOT)])}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          cwd=script.parent, timeout=300)


@pytest.mark.system
def test_repro_fails_with_the_message_then_passes_once_fixed(tmp_path, monkeypatch):
    path = _planted_module(tmp_path, fault=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("planted_repro")
    with pytest.raises(AssertionError) as failure:
        CaseRun(SPEC, "planted_scaled_wgrad", module.ScaledWgrad()).verify()
    message = str(failure.value)
    assert "1.weight" in message
    run = results()
    run["rows"] = [row(SPEC, "planted_scaled_wgrad", "failed", reason=message)]
    [script] = write_repros(run, tmp_path / "report", backend_paths={"planted_scaled_wgrad": path})
    assert script.name == f"{SPEC.id}__planted_scaled_wgrad.py"
    assert f'pytest "cases/test_freeze.py::test_freeze[planted_scaled_wgrad-{SPEC.id}]" --tier pr --backend {path}' \
        in script.read_text()

    broken = _run(script, tmp_path)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert message in broken.stderr

    _planted_module(tmp_path, fault=False)
    fixed = _run(script, tmp_path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert f"PASSED planted_scaled_wgrad {SPEC.id}" in fixed.stdout


def test_only_failed_rows_with_a_spec_get_scripts(tmp_path):
    run = results()
    run["rows"].append(row(FREEZE, "thunder", "error", reason="RuntimeError: boom"))
    run["rows"].append({**row(FREEZE, "eager", "failed"), "spec": None, "nodeid": "tests/x.py::test_y"})
    written = write_repros(run, tmp_path)
    assert [p.name for p in written] == [f"{FREEZE.id}__thunder.py"]
    compile(written[0].read_text(), str(written[0]), "exec")  # the script is valid Python


def test_file_names_and_commands_are_safe():
    dist = SPEC.replace(dist=DistConfig("fsdp", 2, (("sharding", "full/grad op"),)))
    dist_row = row(dist, "fsdp", "failed")
    name = repro_filename(dist_row)
    assert name.endswith("__fsdp.py") and "/" not in name and " " not in name and "=" not in name
    assert pytest_command(dist_row, "nightly") == f'pytest "{dist_row["nodeid"]}" --tier nightly'
    odd = {**row(SPEC, "eager", "failed"), "nodeid": 'cases/t.py::t[a"$b]'}
    assert pytest_command(odd) == 'pytest "cases/t.py::t[a\\"\\$b]" --backend eager'
    long_row = {**row(SPEC, "eager", "failed"), "case_id": "x" * 400}
    assert len(repro_filename(long_row)) <= 183


def test_case_check_runs_the_case_files_test_or_falls_back_to_verify():
    from_file = case_check(f"cases/test_freeze.py::test_freeze[eager-{SPEC.id}]")
    assert from_file.__name__ == "test_freeze" and from_file is not CaseRun.verify
    assert case_check("cases/test_missing.py::test_x[eager-x]") is CaseRun.verify


def test_a_run_given_a_te_build_reproduces_over_that_build(tmp_path):
    run = results()
    run["header"]["te_impl"] = {"name": "tests.minimal_te_build", "why": "--te-impl tests.minimal_te_build"}
    run["rows"].append(row(FREEZE, "te_eager", "failed", reason="boom"))
    [script] = write_repros(run, tmp_path)
    text = script.read_text()
    assert "--backend te_eager --te-impl tests.minimal_te_build" in text and "TE_IMPL = 'tests.minimal_te_build'" in text
    run["header"]["te_impl"] = {"name": "transformer_engine_cpu", "why": "no CUDA device: TE's Python over tex"}
    [default] = write_repros(run, tmp_path / "default")
    assert "--backend te_eager\n" in default.read_text() and "TE_IMPL = None" in default.read_text()
