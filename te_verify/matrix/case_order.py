"""`--case-order collected|reverse|random:SEED`: run the selected cases in another order, to show that no verdict
depends on what ran before it (a case's verdict is a property of the case alone). The same order on every xdist
worker (each reorders its identical collection the same way), so xdist's scheduling stays valid.
"""
from __future__ import annotations

import random

import pytest

ORDERS = ("collected", "reverse", "random:SEED")


def _order(text: str) -> tuple[str, int | None]:
    kind, _, seed = text.partition(":")
    if kind in ("collected", "reverse") and not seed:
        return kind, None
    if kind == "random" and seed.isdigit():
        return kind, int(seed)
    raise pytest.UsageError(f"--case-order {text!r}: expected one of {', '.join(ORDERS)}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("te_verify").addoption(
        "--case-order", default="collected", help="order the cases run in: collected (default), reverse or random:SEED")


def pytest_configure(config: pytest.Config) -> None:
    _order(config.getoption("case_order"))  # a bad value stops the run at start, in one line


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kind, seed = _order(config.getoption("case_order"))
    if kind == "reverse":
        items.reverse()
    elif kind == "random":
        random.Random(seed).shuffle(items)
