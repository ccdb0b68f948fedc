"""scripts/compare_verdicts.py: two runs' verdicts per nodeid and per check; a differing check, a differing outcome
and a row only one run has each make it fail naming them; equal runs pass, rows of another kind are ignored."""
from __future__ import annotations

import json
from pathlib import Path

from loading import load_file

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "compare_verdicts.py"
NODE = "cases/test_freeze.py::test_freeze[eager-lin2]"


def _rows(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    path = tmp_path / f"{name}.jsonl"
    lines = [{"kind": "header"}] + [{"kind": "row", "outcome": "passed", **r} for r in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def _run(monkeypatch, capsys, a: Path, b: Path) -> tuple[int, str]:
    monkeypatch.setattr("sys.argv", ["compare_verdicts.py", str(a), str(b)])
    code = load_file(SCRIPT, "compare_verdicts").main()
    return code, capsys.readouterr().out


def test_equal_runs_pass_counting_what_they_compared(tmp_path, monkeypatch, capsys):
    row = {"nodeid": NODE, "checks": {"grad_parity": "passed", "waste_flops": "passed"}}
    code, out = _run(monkeypatch, capsys, _rows(tmp_path, "a", [row]), _rows(tmp_path, "b", [row]))
    assert code == 0 and "rows: 1 in both" in out and "check verdicts compared: 2; differences: 0" in out, out


def test_a_differing_check_outcome_or_row_fails_naming_it(tmp_path, monkeypatch, capsys):
    a = _rows(tmp_path, "a", [{"nodeid": NODE, "checks": {"grad_parity": "passed"}}, {"nodeid": NODE + "x"}])
    b = _rows(tmp_path, "b", [{"nodeid": NODE, "outcome": "failed", "reason": "timed out",
                               "checks": {"grad_parity": "failed"}}])
    code, out = _run(monkeypatch, capsys, a, b)
    assert code == 1, out
    assert f"{NODE}: outcome passed vs failed (timed out)" in out
    assert f"{NODE}: check grad_parity passed vs failed" in out
    assert f"only in A: {NODE}x" in out
