"""Run several pytest invocations in one interpreter, so torch, thunder and TE are imported once for all of them:
`python tests/pytest_many.py '[["cases", "--collect-only"], [...]]'` prints one JSON line per invocation with its
exit code, the node ids it selected (after --shard's deselection) and what it wrote to sys.stderr (usage errors)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


class SelectedIds:
    """Remembers the items left to run once collection (and deselection) is done."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.ids = [item.nodeid for item in session.items]


def run_many(invocations: list[list[str]], env: dict | None = None) -> tuple[list[dict], subprocess.CompletedProcess]:
    """Run the invocations through this module in a fresh interpreter (tests/ on its path): each one's result (code,
    ids, stderr) and the process."""
    root = Path(__file__).resolve().parents[1]
    env = env or {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(Path(__file__)), json.dumps(invocations)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"code"')], proc


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
