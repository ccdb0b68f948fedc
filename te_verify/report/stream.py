"""rows.jsonl: a run's rows as they finish, so a run killed at any moment keeps every finished verdict.

One JSON object per line, each flushed as written by the process that collects rows (pytest's controller, which
receives every xdist worker's rows; rank 0 under torchrun):

    {"kind": "header", ...}             the run's header, first
    {"kind": "selection", "nodeids": [...]}   every case the run selected (after collection)
    {"kind": "row", ...}                one per finished case
    {"kind": "resumed", "run_id": ...}  a `--resume` continued the run from here
    {"kind": "ended", "why": ...}       the run ended with selected cases left without a row, and why

A line cut short by a kill (the last one) is ignored on reading, and cut off before a `--resume` appends (`repair`),
so the stream stays readable; any other bad line names the file and line.
`partial_results` turns the stream into a results dict: marked incomplete, with the cases that never ran, when
rows are missing.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

STREAM = "rows.jsonl"


class StreamError(ValueError):
    """A rows.jsonl that cannot be read; the message is one line naming the file (and line)."""


class RowStream:
    """Appends lines to `<report dir>/rows.jsonl`, flushing each, so a SIGKILL loses no finished row."""

    def __init__(self, report_dir: Path, append: bool = False) -> None:
        report_dir.mkdir(parents=True, exist_ok=True)
        self.path = report_dir / STREAM
        if append:
            repair(self.path)
        self._file: IO[str] = open(self.path, "a" if append else "w", encoding="utf-8")

    def write(self, kind: str, record: dict[str, Any]) -> None:
        self._file.write(json.dumps({"kind": kind, **record}, default=str, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def repair(path: Path) -> None:
    """End the stream with a whole line before anything is appended: a last line a kill cut short is removed (its row
    never finished; its case runs again), one whole but for its newline gets it."""
    with open(path, "rb+") as handle:
        data = handle.read()
        if not data or data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        try:
            json.loads(data[start:])
        except ValueError:
            handle.truncate(start)
            return
        handle.write(b"\n")


def read_stream(path: Path) -> dict[str, Any]:
    """{"header": dict, "selection": [nodeid] or None, "rows": [row], "why": str or None} from a rows.jsonl (a later
    row of the same nodeid replaces an earlier one; "why": the last run's own word on why cases have no row)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except OSError as exc:
        raise StreamError(f"{path}: cannot read the run's rows: {exc}") from None
    header, selection, rows, why = None, None, {}, None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the last line, cut short by a kill: that row never finished writing
                break
            raise StreamError(f"{path}:{number}: not a JSON line") from None
        kind = record.pop("kind", None)
        if kind == "header" and header is None:
            header = record
        elif kind == "selection":
            selection = record["nodeids"]
        elif kind == "row":
            rows[record["nodeid"]] = record
        elif kind in ("ended", "resumed"):  # a resumed run's own end says why, not the earlier one's
            why = record.get("why")
    if header is None:
        raise StreamError(f"{path}: no header line: not a te_verify rows.jsonl")
    return {"header": header, "selection": selection, "rows": list(rows.values()), "why": why}


def partial_results(report_dir: Path) -> dict[str, Any]:
    """The run in `report_dir` as a results dict; when rows are missing its header says
    `incomplete: {"ran": N, "selected": M, "never_ran": [...]}`."""
    stream = read_stream(Path(report_dir) / STREAM)
    header, rows = dict(stream["header"]), stream["rows"]
    gap = incomplete(rows, stream["selection"], stream["why"] or "the run was killed before they ran")
    if gap is not None:
        header["incomplete"] = gap
    return {"schema_version": 1, "header": header, "rows": rows}


def incomplete(rows: list[dict[str, Any]], selection: list[str] | None, why: str) -> dict[str, Any] | None:
    """The header's `incomplete` for a run whose selected cases do not all have a row (None when they do): how many
    ran, how many were selected, the cases without a row and why they have none."""
    ran = {row["nodeid"] for row in rows}
    never_ran = [nodeid for nodeid in selection or [] if nodeid not in ran]
    if not never_ran and selection is not None:
        return None
    return {"ran": len(rows), "selected": len(selection) if selection is not None else None, "never_ran": never_ran,
            "why": why}


def incomplete_line(header: dict[str, Any]) -> str | None:
    """"incomplete: N of M cases (why)" for a partial run's header, else None."""
    gap = header.get("incomplete")
    if not gap:
        return None
    of = f" of {gap['selected']}" if gap.get("selected") is not None else " (selection never recorded)"
    return f"incomplete: {gap['ran']}{of} cases" + (f" ({gap['why']})" if gap.get("why") else "")


def crash_row(nodeid: str, report: Any, timed_out: str | None = None) -> dict[str, Any]:
    """The row of a case whose xdist worker died under it, named from the node id `cases/test_<family>.py::test[
    <backend>-<case id>]`: outcome "error", reason "crashed: signal N" (the worker's exit status, read from its
    process); or, for a worker that ended itself at the case's timeout, outcome "failed" with `timed_out` (te_verify.
    case_timeout's "timed out after N s" and the stacks) as its reason."""
    worker = getattr(report, "node", None)
    worker_id = getattr(getattr(worker, "gateway", None), "id", "?")
    if timed_out is not None:
        outcome, reason = "failed", timed_out
    else:
        status = _exit_status(worker)
        how = f"signal {-status}" if status is not None and status < 0 else f"exit status {status}"
        outcome, reason = "error", f"crashed: {how} (worker {worker_id} died running it)"
    module, _, test = nodeid.partition("::")
    param = test.partition("[")[2].rstrip("]")
    backend, _, case_id = param.partition("-")
    return {"nodeid": nodeid, "case_id": case_id or test, "family": Path(module).stem.removeprefix("test_"),
            "backend": backend or "-", "outcome": outcome, "reason": reason, "duration": 0.0, "figures": {},
            "spec": None, "expectation": None, "compat": [], "device": None}


def _exit_status(worker: Any) -> int | None:
    """The dead worker's exit status (negative: the signal that killed it), or None where it cannot be read."""
    popen = getattr(getattr(getattr(worker, "gateway", None), "_io", None), "popen", None)
    try:
        return popen.wait(timeout=5) if popen is not None else None
    except Exception:  # an execnet without a Popen, or a process not reaped in time: say so, never fail the run
        return None
