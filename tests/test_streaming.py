"""A run that is killed keeps what it verified: rows stream to rows.jsonl as cases finish, `te-verify report DIR`
renders the partial run, `--resume DIR` completes it, and a case that kills its worker is a row of its own."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from planted_crash import VICTIM
from report_fixtures import results, write

from te_verify.report.stream import STREAM, RowStream, read_stream

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
# Two families' smoke cases (11): enough rows to kill a run a third of the way through. The killed run has an xdist
# worker (rows stream from the controller, as in a user's run); the whole run and the resume run in-process.
RUN = [sys.executable, "-m", "te_verify.cli", "run", "--tier", "smoke", "--backend", "eager", "-k",
       "test_freeze or test_bias"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "te_verify.cli", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600)


def _rows(folder: Path) -> list[str]:
    path = folder / STREAM
    return [line for line in path.read_text().split("\n") if '"kind": "row"' in line] if path.exists() else []


def _kill_part_way(folder: Path, after_rows: int) -> None:
    """Start the smoke tier's eager cases in their own process group and SIGKILL the whole group once `after_rows`
    rows are on disk."""
    proc = subprocess.Popen([*RUN, "--workers", "1", "--report-dir", str(folder)], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(_rows(folder)) < after_rows and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _ran(stdout: str) -> int:
    """How many cases pytest's closing line counts as run (passed, skipped, xfailed, ... but not deselected)."""
    closing = [line for line in stdout.splitlines() if re.search(r" in [\d.]+s", line)][-1]
    counts = re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)\b", closing)
    return sum(int(n) for n, _ in counts)


def _verdicts(folder: Path) -> dict[str, str]:
    rows = json.loads((folder / "results.json").read_text())["rows"]
    assert len({r["nodeid"] for r in rows}) == len(rows), "a case has two rows"
    return {r["nodeid"]: r["outcome"] for r in rows}


@pytest.mark.system
def test_a_killed_run_keeps_its_rows_and_resume_completes_it(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert subprocess.run([*RUN, "--workers", "0", "--report-dir", str(whole)], cwd=ROOT, env=ENV, capture_output=True,
                          timeout=600).returncode == 0
    expected = _verdicts(whole)
    assert {json.loads(line)["backend"] for line in _rows(whole)} == {"eager"}  # --backend eager: its lane alone
    _kill_part_way(killed, after_rows=len(expected) // 3)
    assert not (killed / "results.json").exists()  # results are written at the end: only the stream survived
    lines = (killed / STREAM).read_text().split("\n")
    for line in lines[:-1]:  # every line but a last one cut by the kill is whole JSON
        assert not line or json.loads(line)["kind"] in ("header", "selection", "row")
    stream = read_stream(killed / STREAM)
    assert len(expected) // 3 <= len(stream["rows"]) < len(expected)
    assert sorted(stream["selection"]) == sorted(expected)
    assert all(expected[r["nodeid"]] == r["outcome"] for r in stream["rows"])  # each finished verdict kept

    shown = _cli("report", str(killed))
    assert shown.returncode == 0 and "incomplete:" in shown.stdout, shown.stderr
    header = json.loads((killed / "results.json").read_text())["header"]
    never_ran = header["incomplete"]["never_ran"]
    assert len(never_ran) == len(expected) - len(stream["rows"]) and header["incomplete"]["selected"] == len(expected)
    assert "incomplete:" in (killed / "summary.md").read_text() and never_ran[0] in (killed / "report.html").read_text()

    resumed = subprocess.run([*RUN, "--workers", "0", "--resume", str(killed)], cwd=ROOT, env=ENV,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert _ran(resumed.stdout) == len(never_ran), resumed.stdout[-600:]  # only the cases that had no row
    assert _verdicts(killed) == expected
    assert "incomplete" not in json.loads((killed / "results.json").read_text())["header"]


@pytest.mark.system
def test_a_resume_of_another_selection_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "run"
    assert _cli("run", "--tier", "smoke", "--backend", "eager", "--workers", "0", "--report-dir", str(folder),
                "-k", "freeze1010").returncode == 0
    other = _cli("run", "--tier", "pr", "--backend", "eager", "--workers", "0", "--resume", str(folder))
    errors = [line for line in other.stderr.splitlines() if line.startswith("ERROR:")]
    assert other.returncode == 4 and len(errors) == 1, other.stderr[-2000:]
    assert "tier differs: the run there has 'smoke', this one 'pr'" in errors[0]
    missing = _cli("run", "--tier", "smoke", "--resume", str(tmp_path / "nothing"))
    assert missing.returncode == 4 and "no rows.jsonl there" in missing.stderr


@pytest.mark.system
def test_a_case_that_kills_its_worker_is_a_crashed_row_and_the_run_goes_on(tmp_path):
    folder = tmp_path / "crash"
    proc = _cli("run", "--tier", "smoke", "--backend", "planted_crash:KillsItsWorker", "--workers", "1",
                "--report-dir", str(folder), "cases/test_freeze.py")
    assert proc.returncode == 1, proc.stdout[-3000:]
    rows = {r["case_id"]: r for r in json.loads((folder / "results.json").read_text())["rows"]}
    assert rows[VICTIM]["outcome"] == "error" and rows[VICTIM]["reason"].startswith("crashed: signal 9")
    others = [r for case, r in rows.items() if case != VICTIM]
    assert sum(r["outcome"] == "passed" for r in others) >= 4
    assert {r["outcome"] for r in others} <= {"passed", "skipped"}


def test_a_killed_shard_merges_as_an_incomplete_report(tmp_path):
    """`te-verify report merge` takes a killed shard's folder (rows.jsonl, no results.json) as its partial run."""
    killed, done = tmp_path / "s1", tmp_path / "s2"
    first, second = results("shard-1"), results("shard-2")
    first["header"]["shard"], second["header"]["shard"] = "1/2", "2/2"
    stream = RowStream(killed)
    stream.write("header", {k: v for k, v in first["header"].items() if k != "finished"})
    stream.write("selection", {"nodeids": [r["nodeid"] for r in first["rows"][:3]]})
    stream.write("row", first["rows"][0])
    stream.close()
    with open(killed / STREAM, "a") as handle:
        handle.write('{"kind": "row", "nodeid": "cut sh')  # the line a kill cut short
    second["rows"] = second["rows"][3:]
    write(done / "results.json", second)
    merged = _cli("report", "merge", str(killed), str(done), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr
    header = json.loads((tmp_path / "merged" / "results.json").read_text())["header"]
    assert header["incomplete"]["never_ran"] == [r["nodeid"] for r in first["rows"][1:3]]
    assert "incomplete: 4 of 6 cases" in (tmp_path / "merged" / "summary.md").read_text()


def test_the_header_is_written_once_the_other_plugins_started_the_workers(tmp_path):
    """The controller opens rows.jsonl first and writes the header (backend availability: thunder's import, TE's
    boot) after xdist's session start has spawned the workers, so their start-up overlaps it; the header stays the
    stream's first record."""
    from types import SimpleNamespace

    from te_verify import run_report
    from te_verify.plugin import SESSION

    events = []

    class State:  # the parts of plugin.Session the hook reads
        report_dir, previous, stream, run_id = str(tmp_path), None, None, "r"

        def header(self) -> dict:
            events.append("header")
            return {"tier": "pr", "finished": "later"}

    state, running = State(), list(run_report._CONTROLLER)  # this test run's own controller, put back below
    try:
        hook = run_report.pytest_sessionstart(SimpleNamespace(config=SimpleNamespace(stash={SESSION: state})))
        next(hook)  # before the other plugins' session start: the stream is open, nothing is computed yet
        assert events == [] and state.stream is not None
        events.append("xdist spawns the workers")
        with pytest.raises(StopIteration):
            hook.send(None)
    finally:
        run_report._CONTROLLER[:] = running
    state.stream.close()
    assert events == ["xdist spawns the workers", "header"]
    assert read_stream(tmp_path / STREAM)["header"] == {"tier": "pr"}
