"""`te-verify expectations update`: rewrite expectations/*.toml from a run's results, like
`wpt update-expectations`: new failures get "TODO: triage" entries naming the checks that failed, entries whose
checks passed are removed, reasons, links and conditions are kept (te_verify.expectations defines the files)."""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from te_verify.expectations.entries import (_HEADER, _STEM, UNTRIAGED, Expectation, _covers, load_expectations,
                                    load_file)
from te_verify.expectations.judge import FAILED, GAP_PASSED


@dataclass
class UpdateSummary:
    """What `update_from_results` changed."""

    # (file, case id) of every xfail entry added for a new failure.
    added: list[tuple[str, str]] = field(default_factory=list)
    # (file:line, key) of every entry removed because all its cases passed.
    removed: list[tuple[str, str]] = field(default_factory=list)
    # (file:line, key, still-failing case ids) of entries replaced by per-case entries (some cases now pass).
    narrowed: list[tuple[str, str, list[str]]] = field(default_factory=list)
    # (backend, case id) of failures that could not be mapped to an entry (backend name is not a file stem, or the
    # case raised outside its checks: no check to name).
    unmapped: list[tuple[str, str]] = field(default_factory=list)
    # Files written.
    files: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"added {file}: xfail {case!r} ({UNTRIAGED})" for file, case in self.added]
        out += [f"removed {where}: {key!r} (its cases pass now)" for where, key in self.removed]
        out += [f"narrowed {where}: {key!r} -> {len(ids)} case entries still failing" for where, key, ids in self.narrowed]
        out += [f"skipped backend {b!r}, case {c!r}: not a file stem, or no failing check to name" for b, c in self.unmapped]
        return out or ["expectations are up to date"]


def _toml_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string (or list of strings) is valid TOML


def format_entry(status: str, fields: dict) -> str:
    """One `[[status]]` table with keys in a fixed order."""
    order = ("prefix", "glob", "exclude", "nodeid", "family", "checks", "reason", "link", "failure", "te_version",
             "torch_version", "device")
    body = [f"{k} = {_toml_str(list(fields[k]) if isinstance(fields[k], tuple) else fields[k])}" for k in order
            if fields.get(k) is not None and fields.get(k) != ()]
    return "\n".join([f"[[{status}]]", *body]) + "\n"


def _entry_spans(lines: list[str]) -> dict[int, tuple[int, int]]:
    """header line (1-based) -> (start, end) 0-based slice of the entry, including the comments just above it."""
    heads = [n - 1 for n, line in enumerate(lines, 1) if _HEADER.match(line)]
    starts = []
    for head in heads:
        start = head
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        starts.append(start)
    ends = starts[1:] + [len(lines)]
    return {head + 1: (start, end) for head, start, end in zip(heads, starts, ends)}


def _rewrite(path: Path, replace: dict[int, str], append: list[str]) -> None:
    """Replace the entries at the given header lines (text "" removes one) and append new entries."""
    lines = path.read_text().splitlines() if path.exists() else [f"# Known gaps of backend {path.stem!r}; see te_verify/expectations/entries.py."]
    spans = _entry_spans(lines)
    for head in sorted(replace, reverse=True):
        start, end = spans[head]
        lines[start:end] = replace[head].splitlines() + ([""] if replace[head] else [])
    text = "\n".join(lines).rstrip() + "\n"
    for entry in append:
        text += "\n" + entry
    path.write_text(text)
    load_file(path)  # the rewritten file must load; a bug here must not leave a file that breaks the next run


def _entry_of(gap: dict, entries: list[Expectation]) -> Expectation | None:
    by_row = {(e.file, e.status, e.key): e for e in entries}
    by_name = {(Path(e.file).name, e.status, e.key): e for e in entries}
    key = (gap["file"], gap["status"], gap["prefix"])
    return by_row.get(key) or by_name.get((Path(key[0]).name, key[1], key[2]))


def _entry_passed(entry: Expectation, row: dict) -> bool:
    """Did every check of the entry pass in this row (its per-check states; else the row's outcome)?"""
    states = row.get("checks")
    if states:
        return all(states.get(name) == GAP_PASSED for name in entry.checks)
    return row["outcome"] == "xpassed"


def _new_failure(row: dict, entries: list[Expectation], summary: UpdateSummary) -> list[str]:
    """The checks a failed row needs a new entry for: those that failed with no entry covering them."""
    case_id = row.get("case_id")
    failing = [name for name, state in (row.get("checks") or {}).items() if state == FAILED]
    if not _STEM.match(row["backend"]) or not failing:
        summary.unmapped.append((row["backend"], case_id))
        return []
    covered = {name for e in entries if e.backend == row["backend"]
               and _covers(e, case_id, row["nodeid"], row.get("family")) for name in e.checks}
    return [name for name in failing if name not in covered]


def _plan(rows: list[dict], entries: list[Expectation], summary: UpdateSummary, directory: Path):
    """Per file: {header line: replacement text} and entries to append."""
    outcomes: dict[Expectation, dict[str, str]] = defaultdict(dict)
    new_failures: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for row in rows:
        case_id = row.get("case_id")
        for gap in row.get("gaps") or ([row["expectation"]] if row.get("expectation") else []):
            entry = _entry_of(gap, entries)
            if entry is not None and entry.status == "xfail" and row["outcome"] in ("xfailed", "xpassed", "failed"):
                outcomes[entry][case_id or row["nodeid"]] = "xpassed" if _entry_passed(entry, row) else "xfailed"
        if row["outcome"] in ("failed", "error") and case_id and case_id not in new_failures[row["backend"]]:
            checks = _new_failure(row, entries, summary)
            if checks:
                new_failures[row["backend"]][case_id] = checks
    replace: dict[Path, dict[int, str]] = defaultdict(dict)
    for entry, results in outcomes.items():
        still = sorted(c for c, outcome in results.items() if outcome != "xpassed")
        if len(still) == len(results):
            continue
        replace[Path(entry.file)][entry.line] = "".join(
            format_entry("xfail", {**vars(entry), "prefix": case, "glob": None, "exclude": None, "nodeid": None}) for case in still)
        if still:
            summary.narrowed.append((entry.where, entry.key, still))
        else:
            summary.removed.append((entry.where, entry.key))
    append: dict[Path, list[str]] = defaultdict(list)
    for backend, failures in new_failures.items():
        path = directory / f"{backend}.toml"
        for case_id, checks in failures.items():
            append[path].append(format_entry("xfail", {"prefix": case_id, "checks": checks, "reason": UNTRIAGED,
                                                       "link": ""}))
            summary.added.append((str(path), case_id))
    return replace, append


def update_from_results(results_json: Path, directory: Path) -> UpdateSummary:
    """Rewrite `directory/*.toml` from a run: add xfail entries (reason "TODO: triage", link "") for failures
    no entry covers, remove xfail entries whose cases all passed (xpassed), narrow entries of which only some
    cases passed to per-case entries. Reasons, links, conditions, comments and skip entries are kept."""
    directory = Path(directory)
    rows = json.loads(Path(results_json).read_text())["rows"]
    entries = load_expectations(directory)
    summary = UpdateSummary()
    replace, append = _plan(rows, entries, summary, directory)
    directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(set(replace) | set(append)):
        _rewrite(path, replace.get(path, {}), append.get(path, []))
        summary.files.append(str(path))
    return summary
