"""Run several pytest invocations in one interpreter, so torch, thunder and TE are imported once for all of them:
`python tests/pytest_many.py '[["cases", "--collect-only"], [...]]'` prints one JSON line per invocation with its
exit code, the node ids it selected (after --shard's deselection) and what it wrote to sys.stderr (usage errors)."""
from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest


class SelectedIds:
    """Remembers the items left to run once collection (and deselection) is done."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.ids = [item.nodeid for item in session.items]


def main(invocations: list[list[str]]) -> None:
    for args in invocations:
        selected, stderr = SelectedIds(), io.StringIO()
        with contextlib.redirect_stderr(stderr):
            code = pytest.main(["-p", "no:cacheprovider", "-q", *args], plugins=[selected])
        sys.__stderr__.write(stderr.getvalue())
        print(json.dumps({"code": int(code), "ids": selected.ids, "stderr": stderr.getvalue()[-4000:]}),
              file=sys.__stdout__, flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
