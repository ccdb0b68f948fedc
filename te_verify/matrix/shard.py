"""`--shard K/N`: run the K-th of N deterministic parts of a tier, so several runners split one run.

A case belongs to shard 1 + (sha256 of its case id) mod N: the same on every machine, run, Python version and
xdist worker (Python's own hash() is salted per process), and independent of which other cases exist, so adding
a case never moves another between shards. All backends of one case id land in the same shard (its eager
reference is computed once per runner). `te-verify report merge` puts the shards' reports back together.
Registered by te_verify.plugin.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import pytest


class ShardError(ValueError):
    """A malformed --shard; the message is one line naming it."""


@dataclass(frozen=True)
class Shard:
    """Part `index` (1-based) of `total`."""

    index: int
    total: int

    def __str__(self) -> str:
        return f"{self.index}/{self.total}"

    def holds(self, case_id: str) -> bool:
        return shard_of(case_id, self.total) == self.index


def parse_shard(text: str) -> Shard:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if match is None:
        raise ShardError(f"--shard {text!r}: expected K/N, e.g. 1/3")
    index, total = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= total:
        raise ShardError(f"--shard {text!r}: K must be between 1 and N ({total})")
    return Shard(index, total)


def shard_of(case_id: str, total: int) -> int:
    """The 1-based shard of `case_id` among `total`."""
    digest = hashlib.sha256(case_id.encode("utf-8")).digest()
    return 1 + int.from_bytes(digest[:8], "big") % total


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("te_verify").addoption(
        "--shard", default=None, metavar="K/N",
        help="run only shard K of N of the selected cases (split by case id; merge with te-verify report merge)")


def selected_shard(config: pytest.Config) -> Shard | None:
    """The --shard of this run (None: unsharded); ShardError when malformed (the plugin checks it at start)."""
    text = config.getoption("shard")
    return None if text is None else parse_shard(text)


def case_id_of(item: pytest.Item) -> str:
    """The id a report row gives the item: its spec's id, or the test name for tests drawing their own specs."""
    callspec = getattr(item, "callspec", None)
    run = callspec.params.get("case") if callspec else None
    spec = getattr(run, "spec", None)
    return spec.id if spec is not None else item.name


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the items of other shards (every xdist worker deselects the same ones)."""
    shard = selected_shard(config)
    if shard is None:
        return
    kept = [item for item in items if shard.holds(case_id_of(item))]
    dropped = [item for item in items if not shard.holds(case_id_of(item))]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
