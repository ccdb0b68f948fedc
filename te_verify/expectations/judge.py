"""A case judged check by check against the known gaps that cover it.

Every check of a case runs and passes or fails on its own (a `Verdict`). Each expectation entry covering the case
names the checks its gap is about (`checks`), optionally text their failure must contain (`failure`) and the
elements (parameters) it is about (`elements`, for checks that itemize their problems per element). The case is a
known gap iff every entry holds (each of its checks fails, as described) and every failing check is covered by an
entry. Otherwise it fails, and the message says why, check by check:
- a failing check no entry covers: FAILED BESIDE A KNOWN GAP (a gap blinds only its own checks); likewise a
  covered check's problem with an element no entry covering the check names (a gap blinds only its elements);
- an entry's check that passed: UNEXPECTED PASS, naming the entry (xfail entries are strict);
- an entry's check failing without its text: FAILED DIFFERENTLY.
A check that observed nothing because of another check's outcome (Verdict.blocked_by: the run ended early, which is
`ending`'s) is covered by the gap covering that check: a raise recorded as a gap leaves what later steps would show
unobserved, never passed.
A case with no entry passes iff every check passed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from te_verify.checks.verdict import Verdict
from te_verify.expectations.entries import Expectation, mark_reason

PASSED, FAILED, KNOWN_GAP, GAP_PASSED = "passed", "failed", "known gap", "passed where a gap is recorded"


@dataclass(frozen=True)
class CheckResult:
    """One check's result in one case (a check that returned several verdicts: all must pass)."""

    # The check's name (Verdict.check).
    name: str
    # True when every verdict of that name passed.
    ok: bool
    # The failure messages of that name, joined; "" when ok.
    message: str
    # The failure itemized per element, where the check itemizes (Verdict.problems); () otherwise.
    problems: tuple[str, ...] = ()
    # The check whose outcome left this one nothing to observe (Verdict.blocked_by), where every failure of it says so.
    blocked_by: str | None = None


@dataclass
class Judgement:
    """How a case ends under its known gaps."""

    # "passed", "failed", "xfailed" (exactly its known gaps) or "xpassed" (a recorded gap did not fail).
    outcome: str
    # What the report shows: the failure (failed, xpassed), the gaps' reasons (xfailed), or "".
    message: str
    # Check name -> PASSED, FAILED, KNOWN_GAP or GAP_PASSED: the row's per-check outcomes.
    checks: dict[str, str] = field(default_factory=dict)
    # The entries that held (all their checks failed as described).
    held: list[Expectation] = field(default_factory=list)


def check_results(verdicts: Iterable[Verdict]) -> dict[str, CheckResult]:
    """Verdicts grouped by check name, in first-seen order."""
    grouped: dict[str, list[Verdict]] = {}
    for verdict in verdicts:
        grouped.setdefault(verdict.check, []).append(verdict)
    return {name: CheckResult(name, all(v.ok for v in vs), "\n".join(v.message for v in vs if not v.ok),
                              tuple(p for v in vs if not v.ok for p in v.problems), _blocked_by(vs))
            for name, vs in grouped.items()}


def _blocked_by(verdicts: list[Verdict]) -> str | None:
    blockers = {v.blocked_by for v in verdicts if not v.ok}
    return blockers.pop() if len(blockers) == 1 else None


def _entry_text(entry: Expectation) -> str:
    return f"{entry.where} [[{entry.status}]] {entry.key!r} ({entry.reason})"


def _entry_problems(entry: Expectation, results: dict[str, CheckResult],
                    blocked: set[str]) -> tuple[list[str], list[str]]:
    """(checks of the entry that passed, problems that make the case fail outright) for one entry. A check in
    `blocked` observed nothing because of another covered gap: it is not asked for the entry's failure text."""
    passed, problems = [], []
    for name in entry.checks:
        result = results.get(name)
        if result is None:
            problems.append(f"EXPECTATION NAMES AN ABSENT CHECK: {_entry_text(entry)} covers check {name!r}, which "
                            f"this case does not run (its checks: {', '.join(results) or 'none'})")
        elif result.ok:
            passed.append(name)
    observed = [n for n in entry.checks if n in results and not results[n].ok and n not in blocked]
    failing_text = "\n".join(results[n].message for n in observed)
    if not passed and not problems and observed and entry.failure is not None and entry.failure not in failing_text:
        problems.append(f"FAILED DIFFERENTLY: {_entry_text(entry)} expects checks {', '.join(entry.checks)} to fail "
                        f"with {entry.failure!r}; this is another problem:\n{failing_text}")
    return passed, problems


def _names(problem: str, element: str) -> bool:
    """Whether an itemized problem is about `element` (a qualified name, not a longer one ending in it)."""
    return re.search(rf"(?<![\w.]){re.escape(element)}(?![\w.])", problem) is not None


def _beside_elements(entries: list[Expectation], result: CheckResult) -> list[str]:
    """A covered check's problems with elements the entries covering it do not name; none where an entry covers the
    check whole (no `elements`) or the check does not itemize."""
    covering = [e for e in entries if result.name in e.checks]
    if result.ok or not result.problems or any(not e.elements for e in covering):
        return []
    elements = [el for e in covering for el in e.elements]
    return [p for p in result.problems if not any(_names(p, el) for el in elements)]


def judge(entries: list[Expectation], results: dict[str, CheckResult]) -> Judgement:
    """The case's outcome from its checks' results and the xfail entries covering it (see the module docstring)."""
    covered = {name for entry in entries for name in entry.checks}
    blocked = {r.name for r in results.values() if not r.ok and r.blocked_by in covered
               and r.blocked_by in results and not results[r.blocked_by].ok}  # not observed because of a covered gap (e.g. its raise)
    covered |= blocked
    beside = [r for r in results.values() if not r.ok and r.name not in covered]
    problems = [f"FAILED BESIDE A KNOWN GAP: check {r.name!r} failed:\n{r.message}" if entries else r.message
                for r in beside]
    for result in results.values():
        if result.name in covered and (off := _beside_elements(entries, result)):
            problems.append(f"FAILED BESIDE A KNOWN GAP: check {result.name!r} failed on elements its gap is not "
                            f"about:\n" + "; ".join(off))
    unexpected, held = [], []
    for entry in entries:
        passed, entry_problems = _entry_problems(entry, results, blocked)
        problems += entry_problems
        if passed:
            unexpected.append(f"UNEXPECTED PASS: check(s) {', '.join(passed)} passed where {_entry_text(entry)} "
                              f"records a known gap; remove them from that entry's checks (or the entry), or run "
                              f"`te-verify expectations update <report-dir>`")
        elif not entry_problems:
            held.append(entry)
    checks = {name: _check_state(r, covered) for name, r in results.items()}
    if problems:
        gaps = [f"(known gap beside it: {_entry_text(e)}, checks {', '.join(e.checks)})" for e in held]
        return Judgement("failed", "\n".join(problems + unexpected + gaps), checks, held)
    if unexpected:
        return Judgement("xpassed", "\n".join(unexpected), checks, held)
    if held:
        return Judgement("xfailed", "; ".join(mark_reason(e) for e in held), checks, held)
    return Judgement("passed", "", checks)


def _check_state(result: CheckResult, covered: set[str]) -> str:
    if result.name in covered:
        return GAP_PASSED if result.ok else KNOWN_GAP
    return PASSED if result.ok else FAILED
