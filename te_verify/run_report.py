"""The controller's side of a run: every case's row as it arrives, streamed to rows.jsonl (a killed run keeps
them; --resume continues it), the run's selection, the row of a case that killed its xdist worker or ran past its
timeout, and the report at the end.

Every selected case ends with a row, or the report is marked incomplete naming the cases without one and why (xdist
ran out of worker restarts, pytest stopped early, a timeout under -n 0 ended the run) and the run exits non-zero.
A resumed run exits as the whole run does: the earlier rows' failures count, and nothing left to run is no error.
"""
from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from te_verify.case_timeout import END_RUN, timed_out
from te_verify.expectations.entries import seen_in_rows, stale, stale_message
from te_verify.matrix.tiers import DRAWN_FAMILIES
from te_verify.plugin import ROW_KEY, SESSION, Session, row_of
from te_verify.report.stream import RowStream, crash_row, incomplete, incomplete_line
from te_verify.report.writer import write_report

FAILING = ("failed", "error", "xpassed")
_CONTROLLER: list[Session] = []  # the controller's Session (or the only process's, without xdist)


def add_row(state: Session, row: dict) -> None:
    """A finished case's row: kept for the report and streamed to rows.jsonl at once."""
    state.compat.update(row.pop("compat", []))
    state.rows.append(row)
    if state.stream is not None:
        state.stream.write("row", row)


def finish(state: Session, why: str | None) -> None:
    """Write the report (a resumed run's: the earlier rows and this run's), marked incomplete with `why` where
    selected cases have no row (None: a run that runs no case, --collect-only), and free the folder."""
    header, rows = state.header(), state.rows
    if state.previous is not None:  # a resumed run: the earlier rows and this run's make one report
        header.update(started=state.previous["header"]["started"], resumed=state.run_id,
                      run_id=state.previous["header"]["run_id"])
        rows = [*state.previous["rows"], *rows]
    state.incomplete = incomplete(rows, state.selection, why) if state.selection is not None and why else None
    if state.stream is not None:
        if state.incomplete is not None:
            state.stream.write("ended", {"why": why})
        state.stream.close()
        state.stream = None
    if state.report_dir:
        if state.incomplete:
            header["incomplete"] = state.incomplete
        write_report(Path(state.report_dir), {"schema_version": 1, "header": header, "rows": rows},
                     header["backend_paths"])
    state.release()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _CONTROLLER:
        return
    for key, value in report.user_properties:
        if key == ROW_KEY:
            row = json.loads(value)
            row["worker"] = getattr(report, "node", None) and report.node.gateway.id or "main"
            add_row(_CONTROLLER[0], row)


def pytest_configure(config: pytest.Config) -> None:
    """How a case that times out without xdist ends the run (te_verify.case_timeout calls it)."""
    config.stash[END_RUN] = end_run_after_timeout


@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session: pytest.Session):
    """The controller (or a run without xdist) collects rows: it opens rows.jsonl before any other plugin starts, and
    writes the header after xdist has started the workers (the header's backend availability imports thunder and
    boots TE, seconds of work the workers' own start-up now overlaps instead of waiting for; no row can arrive
    before the run loop, so the header still comes first)."""
    state = None if hasattr(session.config, "workerinput") else session.config.stash[SESSION]
    if state is not None:
        _CONTROLLER[:] = [state]
        if state.report_dir:  # rows stream to disk as they finish: a killed run keeps them (--resume continues)
            state.stream = RowStream(Path(state.report_dir), append=state.previous is not None)
    result = yield
    if state is not None and state.stream is not None:
        if state.previous is None:
            state.stream.write("header", {k: v for k, v in state.header().items() if k != "finished"})
        else:
            state.stream.write("resumed", {"run_id": state.run_id, "started": state.started.isoformat()})
    return result


def _write_selection(nodeids: list[str]) -> None:
    """The cases this run selected, once (a resumed run keeps its first run's selection)."""
    state = _CONTROLLER[0] if _CONTROLLER else None
    if state is None or state.selection is not None or state.previous is not None:
        return
    state.selection = list(nodeids)
    if state.stream is not None:
        state.stream.write("selection", {"nodeids": state.selection})


def pytest_collection_finish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        _write_selection([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    _write_selection(ids)
    cover_with_restarts(node.config, len(ids))


def cover_with_restarts(config: pytest.Config, cases: int) -> None:
    """Without --max-worker-restart, xdist replaces at most 4 dead workers per worker and then stops the run; each
    case can end its worker once (a crash, a timeout), so restarts covering the selection never run out, and stay
    bounded by it. A limit the user gave is kept (the report then names the cases it left without a row)."""
    dsession = config.pluginmanager.getplugin("dsession")
    if config.option.maxworkerrestart is None and dsession is not None:
        dsession._max_worker_restart = max(dsession._max_worker_restart or 0, cases)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Every xdist worker deselects the cases a --resume's earlier run finished (the controller read them once)."""
    node.workerinput["te_verify_done"] = sorted(node.config.stash[SESSION].done)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    """A case that killed its xdist worker (segfault, OOM kill) or ran past its timeout is a row of its own; xdist
    starts a new worker."""
    message = timed_out(report.node.config, report.node.gateway.id)
    if message is not None:  # the terminal shows the timeout and its stacks, not "worker crashed"
        report.longrepr = message
    report.user_properties.append((ROW_KEY, json.dumps(crash_row(crashitem, report, message))))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The report, marked incomplete where selected cases have no row, with a non-zero exit; a resumed run exits as
    the whole run does (its earlier rows' failures count, a run left with nothing to run is not an error)."""
    if hasattr(session.config, "workerinput") or not _CONTROLLER:
        return
    state = _CONTROLLER[0]
    options = session.config.option
    runs_cases = not any(getattr(options, name, False) for name in ("collectonly", "setuponly", "setupplan"))
    finish(state, _why_unfinished(session, exitstatus) if runs_cases else None)
    if state.previous is not None and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK
    rows = [*(state.previous["rows"] if state.previous else []), *state.rows]
    failing = state.incomplete is not None or (state.previous is not None
                                               and any(r["outcome"] in FAILING for r in rows))
    if failing and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _why_unfinished(session: pytest.Session, exitstatus: int) -> str:
    """Why selected cases may have no row: xdist ran out of workers, pytest stopped early, or it was interrupted."""
    dsession = session.config.pluginmanager.getplugin("dsession")
    summary = getattr(dsession, "_summary_report", None)
    if summary:
        return f"xdist: {summary}; --max-worker-restart allows more"
    if session.shouldstop or session.shouldfail:
        return f"pytest stopped: {session.shouldstop or session.shouldfail}"
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return "the run was interrupted"
    return "the run ended before they ran"


def end_run_after_timeout(item: pytest.Item, seconds: float, message: str) -> str:
    """Without xdist (te_verify.case_timeout): the row of the case that timed out and the report marked incomplete,
    written from the watchdog's thread while the case's is stuck; the line that tells the user."""
    if not _CONTROLLER:
        return "the run ends here"
    state = _CONTROLLER[0]
    add_row(state, {**row_of(item), "outcome": "failed", "reason": message, "duration": seconds, "worker": "main"})
    finish(state, "a case timed out under -n 0, where no xdist worker can take over from the stuck process")
    where = f"report in {state.report_dir}" if state.report_dir else "no --report-dir"
    return (f"the run ends here, a case timed out without xdist (-n 0); {where}"
            + (f", {incomplete_line({'incomplete': state.incomplete})}; --resume runs the rest"
               if state.incomplete and state.report_dir else ""))


def pytest_unconfigure(config: pytest.Config) -> None:
    """A run that never reached its end (an error after configure) still frees its report folder."""
    state = config.stash.get(SESSION, None)
    if state is not None:
        state.release()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Name the cases without a row; count a resumed run's rows, the earlier ones included; warn about expectation
    entries that matched no case of this run (stale: remove or fix them)."""
    if hasattr(config, "workerinput") or not _CONTROLLER:
        return
    state = _CONTROLLER[0]
    if state.incomplete is not None:
        never_ran = state.incomplete["never_ran"]
        more = f" and {len(never_ran) - 5} more" if len(never_ran) > 5 else ""
        terminalreporter.write_line(f"te_verify: {incomplete_line({'incomplete': state.incomplete})}; without a row: "
                                    + ", ".join(never_ran[:5]) + more, red=True)
    if state.previous is not None:  # the exit status is the whole run's: say what it counts
        rows = [*state.previous["rows"], *state.rows]
        counts = collections.Counter(row["outcome"] for row in rows)
        terminalreporter.write_line(f"te_verify: the resumed run, its {len(state.previous['rows'])} earlier rows "
                                    "included: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))
    if state.shard is not None:  # the other shards' cases match the rest: only a whole run can tell what is stale
        terminalreporter.write_line(f"te_verify: shard {state.shard}: stale expectations are not judged on a shard")
        return
    if any("::" in arg for arg in config.args):  # a repro's node ids: every other case's entries would read stale
        terminalreporter.write_line("te_verify: stale expectations are not judged on a selection of node ids")
        return
    # Entries are written for the nightly matrix; a pr or smoke run, a -k/-m selection or a capability pass covers part
    # of it, and an entry for the rest would read stale (and a maintainer following the warning would break nightly).
    if all(r.get("backend") in (None, "-") for r in state.rows):  # no case ran (te_verify's own tests)
        return
    if state.tier != "nightly":
        terminalreporter.write_line(f"te_verify: stale expectations are judged on a nightly run (this run: the "
                                    f"{state.tier} tier, part of what the entries cover)")
        return
    selection = [f"{flag} {value!r}" for flag, value in (("-k", config.getoption("keyword")),
                                                          ("-m", config.getoption("markexpr"))) if value]
    if config.getoption("capability_cases", False):
        selection.append("--capability-cases")
    if selection:
        terminalreporter.write_line("te_verify: stale expectations are not judged on a selection ("
                                    + ", ".join(selection) + ")")
        return
    ran = {r["backend"] for r in state.rows}
    found = stale(state.expectations, seen_in_rows(state.expectations, state.rows), env=state.env, backends=ran)
    # A drawn family's entry is met only on days whose draw makes its spec: one run cannot call it stale.
    undrawn = [e for e in found if e.family in DRAWN_FAMILIES]
    for entry in found:
        if entry not in undrawn:
            terminalreporter.write_line(f"te_verify WARNING: {stale_message(entry)}", yellow=True)
    if undrawn:
        terminalreporter.write_line(f"te_verify: {len(undrawn)} expectation(s) of drawn families met by no spec of "
                                    "this run's draw (hypothesis draws anew each UTC day; not judged stale): "
                                    + ", ".join(e.where for e in undrawn))
