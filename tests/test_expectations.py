"""Expectations as data: loading, malformed files (file:line), matching, stale entries, update. How a case is judged
under its entries, check by check, is tests/test_known_gaps.py."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from report_fixtures import FREEZE, FREEZE_X, PEFT_TE, REPLAY, results, row, write

from te_verify.expectations.entries import (
    ExpectationsError, covering, load_expectations, load_file, seen_in_rows, skip_entry, stale, stale_message,
)
from te_verify.expectations.update import update_from_results

LINK = "https://github.com/Lightning-AI/lightning-thunder/issues/2076"
CPU = {"te_version": "absent: ModuleNotFoundError", "device": "cpu: x86_64"}
GPU_TE29 = {"te_version": "2.9.0+abc123", "device": "cuda: NVIDIA H100 x8"}

THUNDER_TE = f'''\
# thunder's TE executor: wgrad for frozen weights (PEFT)
[[xfail]]
prefix = "lin4-w32.64.128.64.32-freeze1010"
checks = ["gemm_work"]
reason = "put_grad(w, grad_w) is unconditional"
link = "{LINK}"

[[xfail]]
prefix = "lin4-w32.64.128.64.32-freeze1010-nobias-x_nograd"
checks = ["fp8_copies"]
reason = "another gap of the same cases: only on CUDA with TE 2.9"
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
    assert (broad.backend, broad.status, broad.line, narrow.line, skip.line) == ("thunder_te", "xfail", 2, 8, 16)
    assert (broad.checks, narrow.checks, skip.checks) == (("gemm_work",), ("fp8_copies",), ())
    case = PEFT_TE.id  # lin4-w32.64.128.64.32-freeze1010-nobias-x_nograd-...
    entries = [broad, narrow, skip]
    assert covering(entries, "thunder_te", case, "cases/test_te.py::t[x]", CPU) == [broad]
    assert covering(entries, "thunder_te", case, "cases/test_te.py::t[x]", GPU_TE29) == [broad, narrow]  # each its check
    assert covering(entries, "te_eager", case, "cases/test_te.py::t[x]", GPU_TE29) == []  # other backend
    skipped = covering(entries, "thunder_te", "lin2-w8.8.8", "cases/test_replay.py::test_replay[x]", CPU)
    assert skipped == [skip] and skip_entry(skipped) is skip and skip_entry([broad]) is None
    assert covering([narrow], "thunder_te", case, "", {"te_version": "3.0.0", "device": "cuda"}) == []


# (what scopes the entry, its TOML line, the env key it reads, (env value, whether the entry holds) ...)
SCOPES = {
    # TE's compiled torch.compile path needs torch >= 2.14: from 2.14 on, a +cpu or +cu local label aside, never
    # where the env names no torch.
    "torch_version": ('torch_version = ">=2.14"', (("2.14.1+cu130", True), ("2.15.0.dev20260101", True),
                                                   ("2.13.0+cpu", False), (None, False))),
    # A columnwise copy only TN-only FP8 GEMMs (Ada, Hopper) read: a gap there, not on sm100.
    "te_capability": ('te_capability = ["sm89", "sm90"]', (("sm90", True), ("sm89", True), ("sm100", False),
                                                           (None, False))),
}


@pytest.mark.parametrize("key", sorted(SCOPES))
def test_an_entry_holds_only_where_its_scope_does(tmp_path, key):
    line, cases = SCOPES[key]
    _write(tmp_path, "te_eager.toml", f'''\
        [[xfail]]
        prefix = "lin4-"
        checks = ["fp8_copies"]
        reason = "a scoped gap"
        link = "{LINK}"
        {line}
        ''')
    (entry,) = load_expectations(tmp_path)
    for value, holds in cases:
        env = {**CPU, key: value}
        if key != "torch_version":
            env["torch_version"] = "2.14.1"  # an entry without torch_version holds for any torch
        assert covering([entry], "te_eager", "lin4-w8", "", env) == ([entry] if holds else []), value


@pytest.mark.parametrize("text, line, words", [
    ('[[xfail]]\nprefix = "a"\nreason = "r\nlink = ""\n', 3, "invalid TOML"),
    ('[[xfail]]\nprefix = "a"\nreason = "r"\nlink = ""\nissue = 5\n', 5, "unknown key 'issue'"),
    ('[[xfail]]\nprefix = "a"\nreason = "r"\nlink = ""\nchecks = "grad_parity"\n', 5, "checks must be a non-empty list"),
    ('[[xfail]]\nprefix = "a"\nreason = "r"\nlink = ""\nchecks = []\n', 5, "checks must be a non-empty list"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\nchecks = ["ending"]\n', 4, "'checks' applies to xfail entries only"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\n\n[[xfail]]\nprefix = "b"\nlink = ""\n', 5, "missing 'reason'"),
    ('[[xfail]]\nprefix = "a"\nreason = "r"\nchecks = ["ending"]\n', 1, "missing 'link'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\n\n[[xfial]]\nprefix = "b"\n', 5, "unknown status 'xfial'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\ndevice = "tpu"\n', 4, "device 'tpu'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\nte_version = "2.9+"\n', 4, "te_version '2.9+'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\ntorch_version = "2.14+"\n', 4, "torch_version '2.14+'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\nte_capability = "hopper"\n', 4, "te_capability 'hopper'"),
    ('[[xfail]]\nprefix = "a"\nreason = "r"\nlink = "#2076"\nchecks = ["ending"]\n', 4, "not an http(s) URL"),
    ('[[skip]]\nreason = "r"\n', 1, "exactly one of 'prefix'"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\n[[skip]]\nprefix = "a"\nreason = "again"\n', 4, "duplicate"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\nte_capability = ["sm89", "sm90"]\n'
     '[[skip]]\nprefix = "a"\nreason = "again"\nte_capability = "sm90"\n', 5, "duplicate"),
    ('[[skip]]\nprefix = "a"\nreason = "r"\n[[skip]]\nprefix = "a"\nreason = "again"\nte_capability = "sm100"\n',
     4, "duplicate"),
])
def test_malformed_file_names_file_and_line(tmp_path, text, line, words):
    path = _write(tmp_path, "thunder.toml", text)
    with pytest.raises(ExpectationsError) as info:
        load_expectations(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: ") and words in message and "\n" not in message


def test_one_key_at_disjoint_capabilities_is_two_entries(tmp_path):
    """A gap measured otherwise at sm90 and at sm100 (other allowances, other exclusions) is two entries."""
    _write(tmp_path, "thunder.toml", '[[skip]]\nprefix = "a"\nreason = "r"\nte_capability = ["sm89", "sm90"]\n'
                                     '[[skip]]\nprefix = "a"\nreason = "r2"\nte_capability = "sm100"\n')
    assert [e.te_capability for e in load_expectations(tmp_path)] == [("sm89", "sm90"), ("sm100",)]


def test_stale_entries_are_reported(tmp_path):
    _write(tmp_path, "thunder_te.toml", THUNDER_TE)
    entries = load_expectations(tmp_path)
    seen = set(covering(entries, "thunder_te", PEFT_TE.id, "cases/test_te.py::t[x]", CPU))
    stale_entries = stale(entries, seen)
    assert [e.line for e in stale_entries] == [8, 16]
    assert [e.line for e in stale(entries, seen, env=CPU)] == [16]  # the CUDA-only entry is inactive here
    assert stale(entries, seen, backends={"thunder"}) == []  # thunder_te did not run
    rows = [row(PEFT_TE, "thunder_te", "xfailed", expectation=next(iter(seen)).to_row())]
    assert seen_in_rows(entries, rows) == seen  # what an xdist controller, which collects nothing, can use
    assert stale_message(stale_entries[1]) == (f"stale expectation {tmp_path}/thunder_te.toml:16: [[skip]] "
                                               "'cases/test_replay.py::' matched no collected case of backend 'thunder_te'")


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
        checks = ["waste_flops"]
        reason = "gone"
        link = "{LINK}"

        [[xfail]]
        prefix = "lin"
        checks = ["grad_parity"]
        reason = "broad gap, partly fixed"
        link = "{LINK}"
        device = "cpu"
    ''')
    gone, broad = (e for e in load_file(path) if e.status == "xfail")
    run = results()
    fixed, still = {"grad_parity": "passed where a gap is recorded"}, {"grad_parity": "known gap"}
    run["rows"] = [
        row(FREEZE, "thunder", "xpassed", expectation=gone.to_row()) | {"checks": {"waste_flops": "passed where a gap is recorded"}},
        row(FREEZE_X, "thunder", "xpassed", expectation=broad.to_row()) | {"checks": fixed},
        row(REPLAY, "thunder", "xfailed", expectation=broad.to_row()) | {"checks": still},
        row(PEFT_TE, "thunder_te", "failed", reason="new") | {"checks": {"gemm_work": "failed", "ending": "passed"}},
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
    assert narrowed.checks == ("grad_parity",)
    [added] = load_file(directory / "thunder_te.toml")
    assert (added.status, added.prefix, added.reason, added.link) == ("xfail", PEFT_TE.id, "TODO: triage", "")
    assert added.checks == ("gemm_work",)  # the check that failed, not the one that passed
    again = update_from_results(tmp_path / "results.json", directory)  # the same results again: nothing to do
    assert again.lines() == ["expectations are up to date"] and again.files == []


def test_glob_entries_match_case_ids_by_pattern(tmp_path: Path) -> None:
    path = tmp_path / "te_eager.toml"
    path.write_text('[[xfail]]\nglob = "lin4-*-fp8delayed"\nreason = "saves the rowwise FP8 weight"\n'
                    f'link = "{LINK}"\nchecks = ["fp8_copies"]\n')
    entries = load_expectations(tmp_path)
    assert covering(entries, "te_eager", "lin4-w32.32-freeze1010-x_grad-fp8delayed", "n", CPU) == entries
    assert covering(entries, "te_eager", "lin4-w32.32-freeze1010-x_grad-fp8current", "n", CPU) == []


def test_entry_needs_exactly_one_selector(tmp_path: Path) -> None:
    path = tmp_path / "te_eager.toml"
    path.write_text(f'[[xfail]]\nprefix = "lin4"\nglob = "lin4*"\nreason = "r"\nlink = "{LINK}"\n')
    with pytest.raises(ExpectationsError, match="te_eager.toml:1: .*exactly one of 'prefix'"):
        load_file(path)
