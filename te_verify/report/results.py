"""results.json: a versioned header plus one row per case run, written atomically."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error")


class ResultsError(ValueError):
    """A results.json that is not of this schema."""


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same folder and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def write_results(path: Path, header: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    rows = sorted(rows, key=lambda r: (r.get("family", ""), r.get("backend", ""), r.get("case_id", ""), r["nodeid"]))
    payload = {"schema_version": SCHEMA_VERSION, "header": header, "rows": rows}
    write_atomic(path, json.dumps(payload, indent=1, sort_keys=True, default=str))
    return path


def load_results(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path}: cannot read results: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION \
            or not isinstance(data.get("header"), dict) or not isinstance(data.get("rows"), list):
        raise ResultsError(f"{path}: not a te_verify results file of schema_version {SCHEMA_VERSION}")
    return data


def outcome_of(report) -> str:
    """A row's outcome from a pytest TestReport (xfailed/xpassed, error outside the call phase)."""
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.when != "call" and report.failed:
        return "error"
    return report.outcome


def reason_of(report) -> str:
    """A row's reason from a pytest TestReport: the xfail reason, the skip reason or the failure's message."""
    if hasattr(report, "wasxfail"):
        return report.wasxfail
    if report.skipped and isinstance(report.longrepr, tuple):
        return report.longrepr[2].removeprefix("Skipped: ")
    if report.failed:
        if isinstance(report.longrepr, str):  # the plugin's own message (known gaps judged): its head says why
            return report.longrepr[:4000]
        crash = getattr(report.longrepr, "reprcrash", None)
        return crash.message if crash else str(report.longrepr)[-2000:]
    return ""
