"""A verdict is the case's alone, whatever ran before it, and --case-order runs a selection in another order.

The order test runs shape and replay cases of torch_compile and torch_compile_dynamic in one process, forward and
reversed, and compares every case's outcome and check results: the first case of each order runs with nothing before
it, so each end of the selection is also compared with itself alone. Without te_verify.run.isolation (dynamo's state kept
between cases) and with torch's default dynamic=None, the torch_compile replays fail after a case with another input
width (automatic dynamic shapes) and pass in the other order. tests/test_isolation.py covers the rest of what is cut.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_plugin import run_pytest

from te_verify.matrix import case_order

ORDERED = ["cases/test_shapes.py", "cases/test_replay.py", "--tier", "nightly", "--backend", "torch_compile",
           "--backend", "torch_compile_dynamic", "-k",
           "(torch_compile- or torch_compile_dynamic-) and ((lin2-w13.37.23 and freeze01 and in8) or "
           "(lin4-w32.32.32.32.32 and freeze0000 and (r2 or r3)))"]


def _verdicts(tmp_path, order: str) -> dict[str, tuple[str, dict]]:
    report = tmp_path / order
    proc = run_pytest(*ORDERED, "--case-order", order, "--report-dir", str(report))
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((report / "results.json").read_text())["rows"]
    return {r["nodeid"]: (r["outcome"], r.get("checks")) for r in rows}


@pytest.mark.system
def test_verdicts_are_equal_forward_and_reversed(tmp_path):
    forward = _verdicts(tmp_path, "collected")
    assert len(forward) == 8 and {outcome for outcome, _ in forward.values()} == {"passed", "xfailed"}, forward
    reverse = _verdicts(tmp_path, "reverse")
    assert {k: v for k, v in reverse.items() if forward.get(k) != v} == {}


def _items(n: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(nodeid=f"case{k}") for k in range(n)]


@pytest.mark.parametrize("order", ["collected", "reverse", "random:3", "cost"])
def test_case_order_reorders_the_collection_the_same_way_every_time(order):
    config = SimpleNamespace(getoption=lambda name: order)
    first, second = _items(12), _items(12)
    case_order.pytest_collection_modifyitems(config, first)
    case_order.pytest_collection_modifyitems(config, second)  # another xdist worker's identical collection
    ids = [item.nodeid for item in first]
    assert ids == [item.nodeid for item in second] and sorted(ids) == sorted(i.nodeid for i in _items(12))
    expected = {"collected": [f"case{k}" for k in range(12)], "reverse": [f"case{k}" for k in reversed(range(12))],
                "cost": [f"case{k}" for k in range(12)]}  # none is in the table: ties keep the collected order
    assert ids == expected[order] if order in expected else ids not in expected.values()


def test_cost_order_runs_the_longest_measured_first_and_a_new_case_as_the_median():
    items = _items(5)
    seconds = {"case0": 0.1, "case1": 9.0, "case2": 3.0, "case4": 3.0}  # case3 is new: the median, 3.0
    assert [i.nodeid for i in case_order.longest_first(items, seconds)] == ["case1", "case2", "case3", "case4", "case0"]
    assert case_order.longest_first(items, {}) == items  # no table: the collected order


def test_the_durations_table_names_collected_cases():
    """The committed table is found and keyed by nodeid (a table keyed otherwise would order nothing)."""
    table = case_order.measured_durations()
    assert len(table) > 100 and all(k.startswith("cases/test_") and "::" in k for k in table)


@pytest.mark.system
def test_a_bad_case_order_is_a_one_line_error():
    proc = run_pytest("cases/test_freeze.py", "--collect-only", "-q", "--case-order", "sideways")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR:")]
    assert proc.returncode == 4 and len(errors) == 1 and "--case-order 'sideways'" in errors[0]
