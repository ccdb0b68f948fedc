"""Temporary folders that outlive no run: each is named after the process that owns it, and folders of processes
that are gone (a SIGKILLed run, a worker killed at its case timeout) are removed when the next one is made.

    /tmp/te_verify_pool_<pid>_<random>       a rank pool's rendezvous store and stack dumps (distributed.pool)
    /tmp/te_verify_timeouts_<pid>_<random>   the per-worker timeout reports of an xdist run (case_timeout)
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

KINDS = ("te_verify_pool", "te_verify_timeouts")
_OWNED = re.compile(r"^(?P<kind>te_verify_[a-z]+)_(?P<pid>\d+)_")


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists (another user's counts: it cannot be signalled but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(root: str | None = None) -> list[str]:
    """Remove every te_verify folder under `root` (default: the temp dir) whose owning process is gone; the paths
    removed."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        match = _OWNED.match(name)
        if match and match.group("kind") in KINDS and not pid_alive(int(match.group("pid"))):
            path = os.path.join(root, name)
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(path)
    return removed


def make(kind: str) -> str:
    """A fresh folder `<tmp>/<kind>_<this pid>_<random>`, after removing the stale folders of dead processes."""
    if kind not in KINDS:
        raise ValueError(f"unknown temporary folder kind {kind!r}; known: {', '.join(KINDS)}")
    remove_stale()
    return tempfile.mkdtemp(prefix=f"{kind}_{os.getpid()}_")


def remove(path: str | Path | None) -> None:
    """Remove a folder made by `make` (nothing when None or already gone)."""
    if path:
        shutil.rmtree(path, ignore_errors=True)
