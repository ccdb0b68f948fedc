"""`--case-order collected|reverse|random:SEED|cost`: run the selected cases in another order, to show that no verdict
depends on what ran before it (a case's verdict is a property of the case alone). The same order on every xdist
worker (each reorders its identical collection the same way), so xdist's scheduling stays valid.

`cost` (the main job's order, te_verify.passes): the longest cases first, by their seconds in a measured run
(`data/pr_durations.json`, `scripts/measure_costs.py --durations REPORT` rewrites it; a case it lacks counts as the
table's median), so xdist's last cases are short ones and its workers finish together instead of one waiting on the
other's last long case. Ties keep the collected order.
"""
from __future__ import annotations

import json
import random
import statistics
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import pytest

ORDERS = ("collected", "reverse", "random:SEED", "cost")
DURATIONS = Path(__file__).resolve().parents[1] / "data" / "pr_durations.json"  # nodeid -> seconds


def _order(text: str) -> tuple[str, int | None]:
    kind, _, seed = text.partition(":")
    if kind in ("collected", "reverse", "cost") and not seed:
        return kind, None
    if kind == "random" and seed.isdigit():
        return kind, int(seed)
    raise pytest.UsageError(f"--case-order {text!r}: expected one of {', '.join(ORDERS)}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("te_verify").addoption(
        "--case-order", default="collected",
        help="order the cases run in: collected (default), reverse, random:SEED or cost (the longest measured first)")


def pytest_configure(config: pytest.Config) -> None:
    _order(config.getoption("case_order"))  # a bad value stops the run at start, in one line


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kind, seed = _order(config.getoption("case_order"))
    if kind == "reverse":
        items.reverse()
    elif kind == "random":
        random.Random(seed).shuffle(items)
    elif kind == "cost":
        items[:] = longest_first(items, measured_durations())


@lru_cache(maxsize=1)
def measured_durations() -> dict[str, float]:
    """nodeid -> seconds, from the committed table ({} when absent)."""
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def longest_first(items: list, seconds: dict[str, float]) -> list:
    """`items` by their measured seconds, longest first; one the table lacks counts as its median (sorted() is stable:
    ties keep their order)."""
    default = statistics.median(seconds.values()) if seconds else 0.0
    return sorted(items, key=lambda item: -seconds.get(item.nodeid, default))


def write_durations(rows: Iterable[dict], path: Path = DURATIONS) -> int:
    """The durations table from a run's rows (the main job's merged report: every pass's nodeids); returns how many
    entries it holds."""
    table = {r["nodeid"]: round(r["duration"], 3) for r in rows if r.get("duration") is not None}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    return len(table)
