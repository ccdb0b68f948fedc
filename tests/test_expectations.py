"""Expectations as data: loading, malformed files (file:line), matching, stale entries, strict xfail, update."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from report_fixtures import FREEZE, FREEZE_X, PEFT_TE, REPLAY, results, row, write

from te_verify.expectations import (
    ExpectationsError, failure_mismatch, load_expectations, load_file, mark_for, match, seen_in_rows, stale,
    stale_message,
)
from te_verify.expectations_update import update_from_results

LINK = "https://github.com/Lightning-AI/lightning-thunder/issues/2076"
CPU = {"te_version": "absent: ModuleNotFoundError", "device": "cpu: x86_64"}
GPU_TE29 = {"te_version": "2.9.0+abc123", "device": "cuda: NVIDIA H100 x8"}

THUNDER_TE = f'''\
# thunder's TE executor: wgrad for frozen weights (PEFT)
[[xfail]]
prefix = "lin4-w32.64.128.64.32-freeze1010"
reason = "put_grad(w, grad_w) is unconditional"
link = "{LINK}"

[[xfail]]
prefix = "lin4-w32.64.128.64.32-freeze1010-nobias-x_nograd"
reason = "narrower: only on CUDA with TE 2.9"
link = "{LINK}"
device = "cuda"
te_version = ">=2.9,<3"

[[skip]]
nodeid = "cases/test_replay.py::"
reason = "TE frees saved state after the first backward (TE issue 990)"
'''


def _write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def test_load_and_match(tmp_path):
    _write(tmp_path, "thunder_te.toml", THUNDER_TE)
    broad, narrow, skip = load_expectations(tmp_path)
    assert (broad.backend, broad.status, broad.line, narrow.line, skip.line) == ("thunder_te", "xfail", 2, 7, 14)
    case = PEFT_TE.id  # lin4-w32.64.128.64.32-freeze1010-nobias-x_nograd-...
    assert match([broad, narrow, skip], "thunder_te", case, "cases/test_te.py::t[x]", CPU) is broad
    assert match([broad, narrow, skip], "thunder_te", case, "cases/test_te.py::t[x]", GPU_TE29) is narrow
    assert match([broad, narrow, skip], "te_eager", case, "cases/test_te.py::t[x]", GPU_TE29) is None  # other backend
    assert match([broad, narrow, skip], "thunder_te", "lin2-w8.8.8", "cases/test_replay.py::test_replay[x]", CPU) is skip
    assert match([narrow], "thunder_te", case, "", {"te_version": "3.0.0", "device": "cuda"}) is None


def test_marks_are_strict_xfail_or_skip(tmp_path):
    _write(tmp_path, "thunder_te.toml", THUNDER_TE)
    broad, _, skip = load_expectations(tmp_path)
    xfail = mark_for(broad)
    assert xfail.name == "xfail" and xfail.kwargs["strict"] is True and LINK in xfail.kwargs["reason"]
    assert mark_for(skip).name == "skip"


@pytest.mark.parametrize("text, line, words", [
    ('[[xfail]]\nprefix = "a"\nreason = "r\nlink = ""\n', 3, "invalid TOML"),
    ('[[xfail]]\nprefix = "a"\nreason = "r"\nlink = ""\nissue = 5\n', 5, "unknown key 'issue'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\n\n[[xfail]]\nprefix = "b"\nlink = ""\n', 5, "missing 'reason'"),
    ('[[xfail]]\nprefix = "a"\nreason = "r"\n', 1, "missing 'link'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\n\n[[xfial]]\nprefix = "b"\n', 5, "unknown status 'xfial'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\ndevice = "tpu"\n', 4, "device 'tpu'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\nte_version = "2.9+"\n', 4, "te_version '2.9+'"),
    ('[[xfail]]\nprefix = "a"\nreason = "r"\nlink = "#2076"\n', 4, "not an http(s) URL"),
    ('[[skip]]\nreason = "r"\n', 1, "exactly one of 'prefix'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\n[[skip]]\nprefix = "a"\nreason = "again"\n', 4, "duplicate"),
])
def test_malformed_file_names_file_and_line(tmp_path, text, line, words):
    path = _write(tmp_path, "thunder.toml", text)
    with pytest.raises(ExpectationsError) as info:
        load_expectations(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: ") and words in message and "\n" not in message


def test_stale_entries_are_reported(tmp_path):
    _write(tmp_path, "thunder_te.toml", THUNDER_TE)
    entries = load_expectations(tmp_path)
    seen = {match(entries, "thunder_te", PEFT_TE.id, "cases/test_te.py::t[x]", CPU)}
    stale_entries = stale(entries, seen)
    assert [e.line for e in stale_entries] == [7, 14]
    assert [e.line for e in stale(entries, seen, env=CPU)] == [14]  # the CUDA-only entry is inactive here
    assert stale(entries, seen, backends={"thunder"}) == []  # thunder_te did not run
    rows = [row(PEFT_TE, "thunder_te", "xfailed", expectation=next(iter(seen)).to_row())]
    assert seen_in_rows(entries, rows) == seen  # what an xdist controller, which collects nothing, can use
    assert stale_message(stale_entries[1]) == (f"stale expectation {tmp_path}/thunder_te.toml:14: [[skip]] "
                                               "'cases/test_replay.py::' matched no collected case of backend 'thunder_te'")


# A conftest that applies entries the way te_verify's plugin does: mark at collection, name the entry on XPASS.
CONFTEST = '''
import pytest
from te_verify.expectations import load_expectations, match, mark_for, xpass_message

ENTRIES = load_expectations(__import__("pathlib").Path(__file__).parent / "expectations")

def pytest_collection_modifyitems(items):
    for item in items:
        entry = match(ENTRIES, "thunder", item.callspec.id, item.nodeid, {"device": "cpu"})
        if entry is not None:
            item.add_marker(mark_for(entry))
            item.stash[KEY] = entry

KEY = pytest.StashKey()

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    entry = item.stash.get(KEY, None)
    if entry is not None and report.when == "call" and report.failed and "XPASS(strict)" in str(report.longrepr):
        report.longrepr = xpass_message(entry)
'''


def test_unexpected_pass_fails_naming_the_entry(tmp_path):
    _write(tmp_path / "expectations", "thunder.toml", f'''\
        [[xfail]]
        prefix = "gap"
        reason = "a gap that got fixed upstream"
        link = "{LINK}"
    ''')
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_x.py").write_text(
        'import pytest\n@pytest.mark.parametrize("v", ["gap-fixed", "gap-open"], ids=lambda v: v)\n'
        'def test_x(v):\n    assert v == "gap-fixed"\n')
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 xfailed" in done.stdout
    expected = f"UNEXPECTED PASS: the case is listed as a known gap by {tmp_path}/expectations/thunder.toml:1 [[xfail]] 'gap'"
    assert expected in done.stdout and "remove that entry" in done.stdout


def test_update_adds_removes_narrows_and_keeps_reasons(tmp_path):
    directory = tmp_path / "expectations"
    path = _write(directory, "thunder.toml", f'''\
        # kept: a comment of the file
        [[skip]]
        prefix = "lin9"
        reason = "never collected; skip entries are kept"

        # fixed upstream: all its cases pass now
        [[xfail]]
        prefix = "{FREEZE.id}"
        reason = "gone"
        link = "{LINK}"

        [[xfail]]
        prefix = "lin"
        reason = "broad gap, partly fixed"
        link = "{LINK}"
        device = "cpu"
    ''')
    gone, broad = (e for e in load_file(path) if e.status == "xfail")
    run = results()
    run["rows"] = [
        row(FREEZE, "thunder", "xpassed", expectation=gone.to_row()),
        row(FREEZE_X, "thunder", "xpassed", expectation=broad.to_row()),
        row(REPLAY, "thunder", "xfailed", expectation=broad.to_row()),
        row(PEFT_TE, "thunder_te", "failed", reason="new"),
        row(FREEZE, "eager", "passed"),
    ]
    summary = update_from_results(write(tmp_path / "results.json", run), directory)
    assert summary.removed == [(gone.where, FREEZE.id)]
    assert summary.narrowed == [(broad.where, "lin", [REPLAY.id])]
    assert summary.added == [(str(directory / "thunder_te.toml"), PEFT_TE.id)]
    text = path.read_text()
    assert "# kept: a comment of the file" in text and "fixed upstream" not in text
    skip, narrowed = load_file(path)
    assert (skip.status, skip.prefix) == ("skip", "lin9")
    assert (narrowed.prefix, narrowed.reason, narrowed.link, narrowed.device) == (REPLAY.id, broad.reason, LINK, "cpu")
    [added] = load_file(directory / "thunder_te.toml")
    assert (added.status, added.prefix, added.reason, added.link) == ("xfail", PEFT_TE.id, "TODO: triage", "")
    again = update_from_results(tmp_path / "results.json", directory)  # the same results again: nothing to do
    assert again.lines() == ["expectations are up to date"] and again.files == []


def test_glob_entries_match_case_ids_by_pattern(tmp_path: Path) -> None:
    path = tmp_path / "te_eager.toml"
    path.write_text('[[xfail]]\nglob = "lin4-*-fp8delayed"\nreason = "saves the rowwise FP8 weight"\n'
                    f'link = "{LINK}"\n')
    entries = load_expectations(tmp_path)
    assert match(entries, "te_eager", "lin4-w32.32-freeze1010-x_grad-fp8delayed", "n", CPU) is entries[0]
    assert match(entries, "te_eager", "lin4-w32.32-freeze1010-x_grad-fp8current", "n", CPU) is None


def test_failure_text_tells_the_known_gap_from_another_failure(tmp_path: Path) -> None:
    path = tmp_path / "thunder_te.toml"
    path.write_text(THUNDER_TE.replace("[[xfail]]\n", '[[xfail]]\nfailure = "(frozen weight): 1 wgrad GEMM"\n', 1))
    entry = load_expectations(tmp_path)[0]
    assert failure_mismatch(entry, "layer 2 (frozen weight): 1 wgrad GEMM, 0 required") is None
    other = failure_mismatch(entry, "grad of 1.weight: max abs error 0.5")
    assert other is not None and "FAILED DIFFERENTLY" in other and f"thunder_te.toml:{entry.line}" in other


def test_entry_needs_exactly_one_selector(tmp_path: Path) -> None:
    path = tmp_path / "te_eager.toml"
    path.write_text(f'[[xfail]]\nprefix = "lin4"\nglob = "lin4*"\nreason = "r"\nlink = "{LINK}"\n')
    with pytest.raises(ExpectationsError, match="te_eager.toml:1: .*exactly one of 'prefix'"):
        load_file(path)
