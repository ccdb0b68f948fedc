"""The pytest plugin: rows from every xdist worker reach results.json, bad options fail in one line,
and an external backend runs through the whole torch lane."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_many import run_many
from proof_tier import PROOF_TIER, PROOF_WORKERS, torch_lane_cases

from te_verify.backends.registry import BUILTINS, DIST_WRAPPERS
from te_verify.matrix.stacks import FAMILIES

ROOT = Path(__file__).resolve().parents[1]


def run_pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.system
def test_rows_from_every_xdist_worker_reach_results(tmp_path):
    report = tmp_path / "report"
    proc = run_pytest("cases/test_freeze.py", "cases/test_bias.py", "--tier", "smoke", "--backend", "eager",
                      "-n", "2", "--report-dir", str(report))
    assert proc.returncode == 0, proc.stdout[-3000:]
    results = json.loads((report / "results.json").read_text())
    expected = len(FAMILIES["freeze"]("smoke")) + len(FAMILIES["bias"]("smoke"))
    assert len(results["rows"]) == expected
    assert {r["worker"] for r in results["rows"]} == {"gw0", "gw1"}
    assert {r["outcome"] for r in results["rows"]} == {"passed"}
    header = results["header"]
    assert header["versions"]["torch"].startswith("2.") and header["tier"] == "smoke"
    assert header["device"].startswith("cpu: ") and header["devices"] == ["cpu"] and header["shard"] is None
    assert any("thunder-named-tensor-stubs" in step for step in header["compat"])
    summary = (report / "summary.md").read_text()
    assert "| freeze |" in summary
    assert "TE implementation: transformer_engine_cpu (TE 2.20.2 Python layer; tex emulated on CPU" in summary


BAD_OPTIONS = [
    (["--backend", "nosuch"], "--backend 'nosuch': unknown backend"),
    (["--backend", "nosuch_module:Thing"], "--backend 'nosuch_module:Thing': cannot load it"),
    (["--backend", "external_backend:NotThere"], "--backend 'external_backend:NotThere': cannot load it"),
    (["--tier", "weekly"], "--tier 'weekly'"),
    (["--device", "tpu"], "--device 'tpu': expected cpu, cuda or cuda:N"),
    (["--shard", "4/3"], "--shard '4/3': K must be between 1 and N (3)"),
]


def many(runs: list[list[str]]) -> list[dict]:
    """Several pytest invocations in one interpreter (tests/pytest_many.py): each one's code, ids and stderr."""
    results, proc = run_many(runs)
    assert len(results) == len(runs) and "INTERNALERROR" not in proc.stdout + proc.stderr, proc.stdout[-3000:]
    return results


@pytest.mark.system
def test_bad_option_is_a_one_line_usage_error():
    results = many([["cases/test_freeze.py", "--collect-only", *option] for option, _ in BAD_OPTIONS])
    for (option, culprit), result in zip(BAD_OPTIONS, results):
        errors = [line for line in result["stderr"].splitlines() if line.startswith("ERROR:")]
        assert result["code"] == 4, (option, result["stderr"][-2000:])  # pytest's usage-error status
        assert len(errors) == 1 and culprit in errors[0] and "Traceback" not in result["stderr"], \
            (option, result["stderr"][-2000:])


@pytest.mark.system
def test_report_header_names_versions_and_compat():
    proc = run_pytest("cases/test_freeze.py", "--collect-only", "--backend", "eager")
    out = proc.stdout
    assert "te_verify versions: python" in out and "thunder 0.2.6" in out
    assert "thunder-named-tensor-stubs" in out
    assert ("te_verify TE implementation: transformer_engine_cpu: TE 2.20.2 Python layer; tex emulated on CPU "
            "(C++ kernels not under test); emulated sm90") in out


@pytest.mark.system
def test_external_backend_runs_the_whole_torch_lane(tmp_path):
    """Every torch-lane case of the proof tier (at pr: every candidate, --pr-candidates), each passing."""
    candidates = ["--pr-candidates"] if PROOF_TIER == "pr" else []
    proc = run_pytest("cases", "--tier", PROOF_TIER, *candidates, "--backend", "external_backend:FunctionalCallBackend",
                      "-n", PROOF_WORKERS, "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    mine = [r for r in rows if r["backend"] == "functional_call"]
    passed = [r for r in mine if r["outcome"] == "passed"]
    # test_compare_options compares a backend's own option sets; an external backend declares none, so it skips
    no_options = [r for r in mine if r["outcome"] == "skipped" and r["nodeid"].startswith("cases/test_compare_options")]
    assert len(passed) + len(no_options) == torch_lane_cases(), [r["nodeid"] for r in mine if r not in passed]


PLANTED = 'checks = ["grad_parity"]\nreason = "planted"\nlink = "https://example.org/planted"\n'


def _entries(tmp_path: Path, *selectors: str) -> Path:
    """An expectations folder whose eager.toml holds one planted grad_parity xfail per selector line."""
    folder = tmp_path / "expectations"
    folder.mkdir()
    (folder / "eager.toml").write_text("".join(f"[[xfail]]\n{selector}\n{PLANTED}" for selector in selectors))
    return folder


def _expectations(tmp_path: Path, prefix: str) -> Path:
    return _entries(tmp_path, f'prefix = "{prefix}"')


@pytest.mark.system
def test_unexpected_pass_fails_naming_the_entry_to_remove(tmp_path):
    passing = FAMILIES["freeze"]("smoke")[0].id
    folder = _expectations(tmp_path, passing)
    proc = run_pytest("cases/test_freeze.py", "--tier", "smoke", "--backend", "eager", "--expectations", str(folder),
                      "--report-dir", str(tmp_path / "report"))
    assert proc.returncode == 1
    assert f"{folder / 'eager.toml'}:1" in proc.stdout and passing in proc.stdout
    rows = json.loads((tmp_path / "report" / "results.json").read_text())["rows"]
    xpassed = [r for r in rows if r["outcome"] == "xpassed"]
    assert len(xpassed) == 1 and xpassed[0]["expectation"]["prefix"] == passing


@pytest.mark.system
def test_stale_expectation_warns_at_the_end_of_a_nightly_run_only(tmp_path):
    folder = _expectations(tmp_path, "lin9-no-such-case")
    proc = run_pytest("cases/test_dtype.py", "--tier", "nightly", "--backend", "eager", "--expectations", str(folder))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "stale expectation" in proc.stdout and "lin9-no-such-case" in proc.stdout
    # Entries are written for the nightly matrix: a pr or smoke run covers part of it, so none is judged, saying so.
    proc = run_pytest("cases/test_dtype.py", "--tier", "smoke", "--backend", "eager", "--expectations", str(folder))
    assert proc.returncode == 0 and "stale expectation " not in proc.stdout
    assert "stale expectations are judged on a nightly run (this run: the smoke tier" in proc.stdout
    # A -k selection of the nightly: the same.
    proc = run_pytest("cases/test_dtype.py", "--tier", "nightly", "--backend", "eager", "--expectations", str(folder),
                      "-k", "freeze1010")
    assert proc.returncode == 0 and "stale expectation " not in proc.stdout
    assert "stale expectations are not judged on a selection (-k 'freeze1010')" in proc.stdout
    # A repro's node id selects one case: every other entry would read stale, so none is judged, saying so.
    nodeid = f"cases/test_freeze.py::test_freeze[eager-{FAMILIES['freeze']('smoke')[0].id}]"
    proc = run_pytest(nodeid, "--tier", "smoke", "--backend", "eager", "--expectations", str(folder))
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:]
    assert "stale expectation " not in proc.stdout and "not judged on a selection of node ids" in proc.stdout


@pytest.mark.system
def test_an_entry_of_a_drawn_family_the_days_draw_misses_is_not_called_stale(tmp_path):
    folder = _entries(tmp_path, 'glob = "*-no-such-draw-*"\nfamily = "generated"', 'prefix = "lin9-no-such-case"')
    proc = run_pytest("cases/test_generated.py", "--tier", "nightly", "--backend", "eager", "--max-examples", "2",
                      "--expectations", str(folder))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "stale expectation " in proc.stdout and "lin9-no-such-case" in proc.stdout  # the enumerated entry
    assert "1 expectation(s) of drawn families met by no spec of this run's draw" in proc.stdout
    assert f"{folder / 'eager.toml'}:1" in proc.stdout and "'*-no-such-draw-*' matched" not in proc.stdout


@pytest.mark.system
def test_nodeid_entry_applies_to_a_test_that_draws_its_own_specs(tmp_path):
    folder = _entries(tmp_path, 'nodeid = "cases/test_generated.py::test_generated[eager]"')
    proc = run_pytest("cases/test_generated.py", "--tier", "nightly", "--backend", "eager", "--max-examples", "3",
                      "--expectations", str(folder), "-rA")
    assert proc.returncode == 1 and "XPASS(strict)" not in proc.stdout  # the plugin rewrites it to name the entry
    assert f"{folder / 'eager.toml'}:1" in proc.stdout and "stale expectation" not in proc.stdout


@pytest.mark.parametrize("failure, passes, bystander", [("forward output", True, False), ("some other gap", False, False),
                                                        ("forward output", True, True)],
                         ids=["its-gap", "another-failure", "beside-an-entry-whose-check-passes"])
@pytest.mark.system
def test_drawn_spec_failing_as_a_recorded_gap_is_that_gap(tmp_path, failure, passes, bystander):
    """A glob entry of family "generated" with a failure text covers the specs hypothesis draws: a drawn spec
    failing with that text is the known gap (noted on the row); failing otherwise is a finding. An entry whose check
    passes on the draw (`bystander`: grad_parity, exact under WrongOutput) is not that draw's gap and changes nothing."""
    folder = tmp_path / "expectations"
    folder.mkdir()
    entry = ('[[xfail]]\nglob = "*"\nfamily = "generated"\nchecks = ["{check}"]\nreason = "planted"\n'
             'link = "https://example.org/planted"\nfailure = "{failure}"\n')
    (folder / "planted_wrong_output.toml").write_text(
        entry.format(check="output_parity", failure=failure)
        + ("\n" + entry.format(check="grad_parity", failure="grad of") if bystander else ""))
    proc = run_pytest("cases/test_generated.py::test_generated", "--tier", "nightly",
                      "--backend", "planted_backends:WrongOutput",
                      "--max-examples", "3", "--hypothesis-seed", "1", "--expectations", str(folder),
                      "--report-dir", str(tmp_path / "report"))
    (row,) = json.loads((tmp_path / "report" / "results.json").read_text())["rows"]
    if passes:
        assert proc.returncode == 0 and row["outcome"] == "passed", proc.stdout[-2000:]
        assert row["drawn_gaps"][0]["link"] == "https://example.org/planted"
    else:
        assert proc.returncode == 1 and row["outcome"] == "failed" and "forward output" in proc.stdout


# The distributed lane runs its smoke tier alone through `te-verify run`; every built-in collects its lane alone.
# Running all eleven cost ~9 minutes of the test command's worker time; each backend's cases run in their own tests
# (eager's and te_eager's smoke families in tests/test_poisoned_device.py, `te-verify run --backend eager` in
# tests/test_streaming.py).
RUN_ALONE = ("ddp",)


def _cli_alone(tmp_path: Path, backend: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "te_verify.cli", "run", "--tier", "smoke", "--backend", backend,
                           "--workers", "0", "--report-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("backend", RUN_ALONE)
@pytest.mark.system
def test_one_backend_per_lane_alone_runs_the_smoke_tier(tmp_path, backend):
    """`te-verify run --tier smoke --backend X` collects and runs X's lane alone: exit 0, never an internal error;
    an unavailable backend's cases skip with the reason."""
    proc = _cli_alone(tmp_path, backend)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "INTERNALERROR" not in proc.stdout + proc.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert rows and {r["backend"] for r in rows} == {backend}  # its lane alone: no other lane's cases
    assert all(r["outcome"] in ("passed", "xfailed", "skipped") for r in rows)


@pytest.mark.system
def test_each_builtin_backend_alone_collects_its_lane_alone():
    """`--backend X` selects X's cases and nothing else, in the lane X declares; collection never errors. One
    interpreter collects for every backend (tests/pytest_many.py), each as its own pytest invocation."""
    backends = sorted(set(BUILTINS) | {"fsdp2"})
    results = many([["cases", "--collect-only", "--tier", "smoke", "--backend", backend] for backend in backends])
    for backend, result in zip(backends, results):
        params = [nodeid.split("[", 1)[1] for nodeid in result["ids"] if "[" in nodeid]
        assert result["code"] == 0, f"--backend {backend}: collection exited {result['code']}"
        assert params and all(p.rstrip("]") == backend or p.startswith(f"{backend}-") for p in params), \
            f"--backend {backend} collected {params[:5]}"


def test_dist_wrapper_names_match_the_wrappers_and_engines():
    from te_verify.distributed.engines import engine
    from te_verify.distributed.wrappers import WRAPPERS

    engines = {name for name in DIST_WRAPPERS if engine(name) is not None}
    assert engines == {"megatron_ddp", "megatron_fsdp", "deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3"}
    assert set(DIST_WRAPPERS) == set(WRAPPERS) | engines
