"""A run never hangs, never loses a verdict, and refuses bad input in one line (issue 27, points 1-6 and 10).

Each fault is planted (tests/planted_crash.py) on the smallest selection that shows it: the smoke tier's five
freeze cases, run by pytest on cases/test_freeze.py.
"""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from planted_crash import VICTIM

from te_verify.checks.names import CHECKS
from te_verify.expectations.entries import ExpectationsError, load_file
from te_verify.run_report import cover_with_restarts
from te_verify.report.lock import LOCK, ReportLockError, acquire
from te_verify.report.stream import STREAM, read_stream

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
FREEZE = [sys.executable, "-m", "pytest", "cases/test_freeze.py", "-q", "-p", "no:cacheprovider", "--tier", "smoke"]
TIMEOUT_S = 5


def _run(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*FREEZE, *args], cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=timeout)


def _results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def _victim(rows: list[dict]) -> dict:
    return next(r for r in rows if r["case_id"] == VICTIM)


def _hanging_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """A run of the hanging backend that ends by itself within the timeout + 60 s of the hang's start (measured from
    there: starting interpreters on a loaded machine is not the run hanging)."""
    started = tmp_path / "hang_started"
    env = {**ENV, "TE_VERIFY_TEST_HANG_STARTED": str(started)}
    proc = _run("--backend", "planted_crash:HangsInForward", "--case-timeout", str(TIMEOUT_S), *args, env=env)
    assert time.time() - float(started.read_text()) < TIMEOUT_S + 60
    return proc


@pytest.mark.system
def test_a_hanging_case_fails_timed_out_with_its_stack_and_the_run_goes_on(tmp_path):
    """Under xdist: the hung case's worker ends, its row says where it hung, a new worker runs the rest."""
    proc = _hanging_run(tmp_path, "-n", "1", "--report-dir", str(tmp_path / "report"))
    assert proc.returncode == 1, proc.stdout[-3000:]
    results = _results(tmp_path / "report")
    victim = _victim(results["rows"])
    assert victim["outcome"] == "failed" and victim["reason"].startswith(f"timed out after {TIMEOUT_S} s")
    assert "in hang_in_forward" in victim["reason"] and "threading.Event().wait()" in victim["reason"]  # its stack
    assert f"timed out after {TIMEOUT_S} s" in proc.stdout  # the terminal shows it, not "worker crashed"
    others = [r for r in results["rows"] if r is not victim]
    assert len(others) == 4 and {r["outcome"] for r in others} == {"passed"}
    assert "incomplete" not in results["header"]


@pytest.mark.system
def test_without_xdist_a_hanging_case_ends_the_run_marked_incomplete_and_resume_finishes_it(tmp_path):
    """-n 0: nothing can replace the stuck process; the run ends with the timed-out row and an incomplete report,
    exit status 2, and --resume runs the cases that never ran."""
    folder = tmp_path / "report"
    proc = _hanging_run(tmp_path, "-n", "0", "--report-dir", str(folder))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "in hang_in_forward" in proc.stderr and "--resume runs the rest" in proc.stderr
    header, rows = _results(folder)["header"], _results(folder)["rows"]
    assert _victim(rows)["reason"].startswith(f"timed out after {TIMEOUT_S} s")
    gap = header["incomplete"]
    assert gap["selected"] == 5 and gap["ran"] == len(rows) == 2 and len(gap["never_ran"]) == 3
    assert "timed out under -n 0" in gap["why"] and "timed out under -n 0" in (folder / "summary.md").read_text()
    resumed = _run("--backend", "planted_crash:HangsInForward", "-n", "0", "--case-timeout", str(TIMEOUT_S),
                   "--resume", str(folder))
    assert resumed.returncode == 1, resumed.stdout[-2000:]  # the whole run's status: the timed-out case failed
    assert "3 passed" in resumed.stdout and "its 2 earlier rows included: 1 failed, 4 passed" in resumed.stdout
    results = _results(folder)
    assert "incomplete" not in results["header"] and len(results["rows"]) == 5


@pytest.mark.system
def test_more_crashes_than_worker_restarts_leave_no_case_silently_without_a_row(tmp_path):
    """Every case kills its worker and xdist may replace none: the case left over is named, the run fails."""
    proc = _run("--backend", "planted_crash:KillsEveryWorker", "-n", "1", "--max-worker-restart", "0",
                "-k", "freeze1010 or freeze1100", "--report-dir", str(tmp_path))
    assert proc.returncode != 0
    results = _results(tmp_path)
    assert [r["reason"].startswith("crashed: signal 9") for r in results["rows"]] == [True]
    gap = results["header"]["incomplete"]
    assert (gap["ran"], gap["selected"], len(gap["never_ran"])) == (1, 2, 1)
    assert "crashed and worker restarting disabled" in gap["why"]
    assert f"without a row: {gap['never_ran'][0]}" in proc.stdout
    assert gap["never_ran"][0] in (tmp_path / "summary.md").read_text()


def test_worker_restarts_cover_the_selection_unless_the_user_set_a_limit():
    dsession = SimpleNamespace(_max_worker_restart=4)  # xdist's default for -n 1
    config = SimpleNamespace(option=SimpleNamespace(maxworkerrestart=None),
                             pluginmanager=SimpleNamespace(getplugin=lambda name: dsession))
    cover_with_restarts(config, 22)
    assert dsession._max_worker_restart == 22
    config.option.maxworkerrestart, dsession._max_worker_restart = "1", 1
    cover_with_restarts(config, 22)
    assert dsession._max_worker_restart == 1


def _cut_last_rows(folder: Path, keep: int) -> None:
    """What a SIGKILL while writing leaves: `keep` whole rows after the header and selection, then half a line."""
    lines = (folder / STREAM).read_text().split("\n")
    (folder / STREAM).write_text("\n".join(lines[:2 + keep] + [lines[2 + keep][:40]]))


@pytest.mark.system
def test_a_cut_last_line_then_two_resumes_keep_the_stream_readable_and_complete_the_report(tmp_path):
    args = ("--backend", "eager", "-n", "0")  # the freeze family's smoke cases: 3 rows kept, the 4th cut
    assert _run(*args, "--report-dir", str(tmp_path)).returncode == 0
    expected = {r["nodeid"]: r["outcome"] for r in _results(tmp_path)["rows"]}
    _cut_last_rows(tmp_path, keep=3)
    for _ in range(2):
        resumed = _run(*args, "--resume", str(tmp_path))
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        stream = read_stream(tmp_path / STREAM)  # raises on any bad line
        assert all(json.loads(line) for line in (tmp_path / STREAM).read_text().splitlines())
        assert {r["nodeid"]: r["outcome"] for r in stream["rows"]} == expected
        results = _results(tmp_path)
        assert "incomplete" not in results["header"] and len(results["rows"]) == len(expected)
    versions = results["header"]["versions"]  # what a run's cases can execute, each with its version
    for package in ("megatron-core", "megatron-fsdp", "deepspeed", "transformers", "peft", "litgpt", "torch",
                    "thunder", "fairscale", "transformer_engine", "pytest", "pytest-xdist", "hypothesis"):
        assert versions.get(package), package


@pytest.mark.system
def test_a_second_run_into_a_live_runs_report_folder_is_refused_in_one_line(tmp_path):
    """The first run holds its folder open until the test lets it end; the second (te-verify run) is refused."""
    folder, flag = tmp_path / "report", tmp_path / "flag"
    env = {**ENV, "TE_VERIFY_TEST_FLAG": str(flag)}
    args = ("--backend", "planted_crash:WaitsForFlag", "--report-dir", str(folder), "-k", "freeze1010")
    first = subprocess.Popen([*FREEZE, "-n", "0", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (folder / STREAM).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        holder = json.loads((folder / LOCK).read_text())
        second = subprocess.run([sys.executable, "-m", "te_verify.cli", "run", "--tier", "smoke", "--workers", "0",
                                 *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        flag.touch()
        out, _ = first.communicate(timeout=300)
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 4 and len(lines) == 1, second.stderr[-2000:]
    assert lines[0].startswith(f"ERROR: --report-dir {folder} is in use by run {holder['run_id']} (pid {first.pid}")
    assert "report in" not in second.stdout
    assert first.returncode == 0, out[-2000:]
    results = _results(folder)
    assert results["header"]["run_id"] == holder["run_id"] and len(results["rows"]) == 1
    assert not (folder / LOCK).exists()  # freed at the end


def test_a_stale_lock_is_taken_over_and_a_live_one_refused(tmp_path):
    (tmp_path / LOCK).write_text(json.dumps({"pid": 2 ** 22 + 1, "host": os.uname().nodename, "run_id": "dead"}))
    acquire(tmp_path, "mine").release()  # a lock file of a dead run: taken over
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; from "
                               "te_verify.report.lock import acquire; acquire(Path(sys.argv[1]), 'theirs'); "
                               "print('held', flush=True); time.sleep(60)", str(tmp_path)],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ReportLockError, match=f"in use by run theirs \\(pid {holder.pid} on"):
            acquire(tmp_path, "mine")
    finally:
        holder.kill()
        holder.wait()
    acquire(tmp_path, "mine").release()  # its holder died: the flock went with it


@pytest.mark.parametrize("args, culprit", [
    (("--backend", "te_verify.spec:CaseSpec"), "--backend 'te_verify.spec:CaseSpec': CaseSpec is a class that "
                                               "cannot be made without arguments"),
    (("--backend", "eager", "--expectations", "{bad}"), "eager.toml:5: checks: unknown check 'grad_parrity' (did "
                                                        "you mean 'grad_parity'?)"),
    (("-n", "2", "-k", "overlap=True"), "-k 'overlap=True': at column 8: expected end of input; got ="),
])
@pytest.mark.system
def test_bad_input_is_one_line(tmp_path, args, culprit):
    (tmp_path / "eager.toml").write_text('[[xfail]]\nprefix = "lin4-"\nreason = "r"\nlink = "https://x.org/1"\n'
                                         'checks = ["grad_parrity"]\n')
    proc = _run(*[a.format(bad=tmp_path) for a in args], "--collect-only")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 4 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("ERROR: ") and culprit in lines[0]
    what = ("prepare(model, spec)" if "CaseSpec" in culprit else "words joined by and, or, not" if "-k" in args
            else f"the checks that exist: {CHECKS[0]}, ")
    assert what in lines[0]


def test_an_expectation_naming_a_check_that_does_not_exist_is_refused_when_loaded(tmp_path):
    path = tmp_path / "thunder.toml"
    path.write_text('[[xfail]]\nprefix = "lin4-"\nreason = "r"\nlink = "https://x.org/1"\n'
                    'checks = ["ending", "grad_parrity"]\n')
    with pytest.raises(ExpectationsError) as info:
        load_file(path)
    assert str(info.value).startswith(f"{path}:5: checks: unknown check 'grad_parrity' (did you mean 'grad_parity'?)")
    assert ", ".join(CHECKS) in str(info.value)


def _check_names_in_code() -> dict[str, str]:
    """Every check name the code gives a Verdict, with where: the name argument of Verdict(...) and of every function
    that passes its own parameter on as one (not_observed, merge_ranks, ...), `check=` keywords, `.check = ...`, and
    the values of a module's dict such a keyword or assignment looks a name up in (`check=RENAMED[v.check]`)."""
    trees = {path: ast.parse(path.read_text())
             for folder in ("te_verify", "cases") for path in (ROOT / folder).rglob("*.py")}
    makers = {"Verdict": ("check", 0)}  # function name -> (its name parameter, position)
    while True:
        found = {fn.name: found for tree in trees.values() for fn in ast.walk(tree)
                 if isinstance(fn, ast.FunctionDef) and fn.name not in makers and (found := _passes_name(fn, makers))}
        if not found:
            break
        makers.update(found)
    names = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            value = None
            if isinstance(node, ast.Call) and _callee(node) in makers:
                value = _argument(node, *makers[_callee(node)])
            elif isinstance(node, ast.Call):
                value = next((k.value for k in node.keywords if k.arg == "check"), None)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "check"
                                                      for t in node.targets):
                value = node.value
            for name in _strings(value, tree):
                names.setdefault(name, f"{path.relative_to(ROOT)}:{node.lineno}")
    return names


def _strings(value: ast.expr | None, tree: ast.Module) -> list[str]:
    """A string constant's value, or the string values of the module-level dict `value` subscripts."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return [value.value]
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name):
        tables = [node.value for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                  and any(isinstance(t, ast.Name) and t.id == value.value.id for t in node.targets)]
        return [v.value for table in tables for v in table.values if isinstance(v, ast.Constant)]
    return []


def _callee(call: ast.Call) -> str | None:
    return call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)


def _argument(call: ast.Call, name: str, position: int) -> ast.expr | None:
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == name), None)


def _passes_name(fn: ast.FunctionDef, makers: dict) -> tuple[str, int] | None:
    """(parameter, position) when `fn` hands one of its parameters to a maker as the check name."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    for call in ast.walk(fn):
        if isinstance(call, ast.Call) and _callee(call) in makers:
            value = _argument(call, *makers[_callee(call)])
            if isinstance(value, ast.Name) and value.id in params:
                return value.id, params.index(value.id)
    return None


def test_every_check_name_in_the_code_is_registered():
    names = _check_names_in_code()
    # The extraction sees every way a name is given: Verdict, a helper passing it on, a `check=` keyword, `.check =`.
    assert {"grad_parity", "dist_waste_saved", "grad_accumulation", "parity_vs_te_eager"} <= set(names)
    assert not set(CHECKS) - set(names), f"registered names no code gives: {sorted(set(CHECKS) - set(names))}"
    missing = {name: where for name, where in names.items() if name not in CHECKS}
    assert not missing, f"check names used in the code but missing from te_verify/checks/names.py: {missing}"
    assert list(CHECKS) == sorted(set(CHECKS))


@pytest.mark.system
def test_a_killed_rank_pool_leaves_nothing_in_tmp_after_the_next_start(tmp_path):
    script = ("from te_verify.distributed.pool.pool import RankPool; import time; pool = RankPool(world_size=2); "
              "pool.start(); print(pool._tmpdir, *pool.pids, flush=True); time.sleep(120)")
    owner = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    folder, *ranks = owner.stdout.readline().split()
    assert f"te_verify_pool_{owner.pid}_" in folder and Path(folder).is_dir()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert Path(folder).is_dir()  # what a SIGKILL leaves ...
    from te_verify.distributed.pool.pool import RankPool, process_gone

    deadline = time.monotonic() + 10
    while not all(process_gone(int(pid)) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(process_gone(int(pid)) for pid in ranks)  # its ranks died with it
    pool = RankPool(world_size=2)
    pool.start()  # ... the next pool removes
    pool.close(graceful=True)
    assert not Path(folder).exists()
