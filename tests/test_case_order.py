"""A verdict is the same alone and in any order: the replay cases whose inductor verdict used to depend on what ran
before (a backward loaded from inductor's cache raised under retain_graph) run in collected and in reverse order
in one process, and each alone, with equal outcomes per case; --case-order refuses a bad value in one line."""
from __future__ import annotations

import json

from test_plugin import run_pytest

SELECT = ["cases/test_replay.py", "--tier", "nightly", "--backend", "torch_compile_inductor", "--backend",
          "torch_compile", "-k", "lin4-w32.32.32.32.32 and freeze0000 and x_grad and in8 and (r2 or r3)"]


def _outcomes(tmp_path, name: str, *extra: str) -> dict[str, str]:
    report = tmp_path / name
    proc = run_pytest(*SELECT, "--report-dir", str(report), *extra)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    return {r["nodeid"]: r["outcome"] for r in json.loads((report / "results.json").read_text())["rows"]}


def test_outcomes_are_equal_in_any_order_and_alone(tmp_path):
    forward = _outcomes(tmp_path, "forward")
    assert len(forward) >= 4
    assert _outcomes(tmp_path, "reverse", "--case-order", "reverse") == forward
    last = sorted(forward)[-1]  # the case that ran after every other in the forward order, alone
    alone = run_pytest(last, "--tier", "nightly", "--backend", last.split("[")[1].split("-")[0], "-q")
    assert ("1 passed" in alone.stdout) == (forward[last] == "passed"), alone.stdout[-1500:]


def test_a_bad_case_order_is_a_one_line_error():
    proc = run_pytest("cases/test_freeze.py", "--collect-only", "-q", "--case-order", "sideways")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR:")]
    assert proc.returncode == 4 and len(errors) == 1 and "--case-order 'sideways'" in errors[0]
