"""`--resume DIR`: finish a run that was killed, running only the selected cases that have no row yet.

The run in DIR (its rows.jsonl, te_verify.report.stream) must be the same selection on the same systems: same
tier, shard, backends, device kind, TE implementation and installed versions of what is under test. Anything else
is refused in one line naming the difference, since its rows could not be mixed with this run's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from te_verify.report.stream import STREAM, StreamError, read_stream


class ResumeError(ValueError):
    """A --resume that cannot continue the run; one line naming the difference."""


def _selection(header: dict[str, Any]) -> dict[str, Any]:
    """What must match for rows of two runs to be one run's."""
    return {"tier": header.get("tier"), "shard": header.get("shard"),
            "backends": sorted(header.get("backends", {})), "dist wrappers": sorted(header.get("dist_wrappers", [])),
            "device": str(header.get("device", "")).split(":")[0], "TE implementation": header.get("te_impl", {}).get("name"),
            **{f"{name} version": version for name, version in sorted(header.get("versions", {}).items())}}


def stream_of(report_dir: str | Path) -> dict[str, Any]:
    """The stream ({"header", "selection", "rows"}) of the run in `report_dir`; te-verify run reads it before it
    starts pytest, so a folder that is no run's is refused in a second."""
    path = Path(report_dir) / STREAM
    if not path.exists():
        raise ResumeError(f"--resume {report_dir}: no {STREAM} there (not a te_verify report folder, or a run that "
                          f"never started)")
    try:
        return read_stream(path)
    except StreamError as exc:
        raise ResumeError(f"--resume {report_dir}: {exc}") from None


def load_previous(report_dir: str | Path, header: dict[str, Any]) -> dict[str, Any]:
    """The earlier run's stream if `header` (this run's) continues it."""
    previous = stream_of(report_dir)
    before, now = _selection(previous["header"]), _selection(header)
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            raise ResumeError(f"--resume {report_dir}: {key} differs: the run there has {before.get(key)!r}, this one "
                              f"{now.get(key)!r}")
    return previous


def done_nodeids(previous: dict[str, Any]) -> list[str]:
    """The cases of the earlier run that already have a row (a crashed case's row included)."""
    return sorted(row["nodeid"] for row in previous["rows"])
