"""Known upstream gaps as data: `expectations/<backend>.toml`, one file per backend or wrapper.

    # expectations/thunder_te.toml
    [[xfail]]
    prefix = "lin4-w32.32.32.32.32-freeze1010"    # case-id prefix (or nodeid = "<pytest node-id prefix>")
    reason = "thunder's TE executor computes wgrad for frozen weights"
    link = "https://github.com/Lightning-AI/lightning-thunder/issues/2076"
    device = "cuda"                               # optional: "cpu" or "cuda"
    te_version = ">=2.9,<3"                       # optional: a version range; never holds when TE is absent

    [[skip]]
    prefix = "lin2-"
    reason = "..."

An entry applies to the cases whose backend is the file's stem. `xfail` entries are strict: an unexpected
pass fails and names the entry to remove (`xpass_message`). Entries that match no collected case are stale
(`stale`). `update_from_results` rewrites the files from a run's results, like `wpt update-expectations`.
A malformed file raises ExpectationsError with a one-line message naming the file and line.
"""
from __future__ import annotations

import json
import re
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

STATUSES = ("xfail", "skip")
KEYS = {"prefix", "nodeid", "reason", "link", "te_version", "device"}
DEVICES = ("cpu", "cuda")
UNTRIAGED = "TODO: triage"
_HEADER = re.compile(r"^\s*\[\[\s*([^\]\s]+)\s*\]\]")
_TOP_KEY = re.compile(r"^\s*\[*\s*([A-Za-z0-9_\-]+)")
_TOML_LINE = re.compile(r"at line (\d+)")
_STEM = re.compile(r"^[A-Za-z0-9_.\-]+$")


class ExpectationsError(ValueError):
    """A malformed expectations file; the message is one line naming the file and line."""


@dataclass(frozen=True)
class Expectation:
    """One entry of an expectations file."""

    # Path of the TOML file, as given to load_expectations (relative paths stay relative).
    file: str
    # 1-based line of the entry's `[[xfail]]` / `[[skip]]` header.
    line: int
    # The backend or wrapper the entry applies to: the file's stem.
    backend: str
    # "xfail" (strict) or "skip".
    status: str
    # Case-id prefix (matched against spec.id), or None when the entry is keyed by node id.
    prefix: str | None
    # pytest node-id prefix, or None.
    nodeid: str | None
    # Why the gap exists; shown in the report and in pytest's xfail/skip reason.
    reason: str
    # Upstream issue/PR URL; "" for entries added by `expectations update` that nobody triaged yet.
    link: str = ""
    # Optional TE version range (PEP 440 specifier set, e.g. ">=2.9,<3").
    te_version: str | None = None
    # Optional device kind the entry is limited to: "cpu" or "cuda".
    device: str | None = None

    @property
    def key(self) -> str:
        return self.prefix if self.prefix is not None else str(self.nodeid)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def to_row(self) -> dict[str, str]:
        """The `expectation` field of a results.json row."""
        return {"file": self.file, "prefix": self.key, "status": self.status, "reason": self.reason, "link": self.link}


def _fail(path: Path, line: int | None, what: str) -> ExpectationsError:
    return ExpectationsError(f"{path}:{line if line is not None else 1}: {what}")


def _headers(text: str) -> list[tuple[str, int]]:
    """(status, 1-based line) of every `[[...]]` header, in file order."""
    return [(m.group(1), n) for n, line in enumerate(text.splitlines(), 1) if (m := _HEADER.match(line))]


def _key_line(text: str, key: str, start: int = 1) -> int:
    """First line at or after `start` that assigns or opens `key`; `start` when not found."""
    for n, line in enumerate(text.splitlines()[start - 1:], start):
        match = _TOP_KEY.match(line)
        if match and match.group(1) == key and not line.lstrip().startswith("#"):
            return n
    return start


def _check_entry(path: Path, text: str, line: int, status: str, entry: Any) -> Expectation:
    if not isinstance(entry, dict):
        raise _fail(path, line, f"[[{status}]] must be a table")
    for key in entry:
        if key not in KEYS:
            raise _fail(path, _key_line(text, key, line), f"unknown key {key!r} in [[{status}]] (allowed: {', '.join(sorted(KEYS))})")
    for key, value in entry.items():
        if not isinstance(value, str):
            raise _fail(path, _key_line(text, key, line), f"{key} must be a string, got {value!r}")
    if ("prefix" in entry) == ("nodeid" in entry):
        raise _fail(path, line, f"[[{status}]] needs exactly one of 'prefix' (case id) or 'nodeid'")
    if not entry.get("reason", "").strip():
        raise _fail(path, line, f"[[{status}]] {entry.get('prefix') or entry.get('nodeid')!r}: missing 'reason'")
    if status == "xfail" and "link" not in entry:
        raise _fail(path, line, f"[[xfail]] {entry.get('prefix') or entry.get('nodeid')!r}: missing 'link' (upstream URL)")
    link = entry.get("link", "")
    if link and not link.startswith(("http://", "https://")):
        raise _fail(path, _key_line(text, "link", line), f"link {link!r} is not an http(s) URL")
    if "device" in entry and entry["device"] not in DEVICES:
        raise _fail(path, _key_line(text, "device", line), f"device {entry['device']!r}: expected one of {DEVICES}")
    if "te_version" in entry:
        try:
            SpecifierSet(entry["te_version"])
        except InvalidSpecifier:
            raise _fail(path, _key_line(text, "te_version", line), f"te_version {entry['te_version']!r} is not a version range like '>=2.9,<3'") from None
    return Expectation(file=str(path), line=line, backend=path.stem, status=status, prefix=entry.get("prefix"),
                       nodeid=entry.get("nodeid"), reason=entry["reason"], link=link,
                       te_version=entry.get("te_version"), device=entry.get("device"))


def load_file(path: Path) -> list[Expectation]:
    """The entries of one file, in file order; ExpectationsError (file:line) if it is malformed."""
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_LINE.search(str(exc))
        raise _fail(path, int(found.group(1)) if found else None, f"invalid TOML: {exc}") from None
    for key, value in data.items():
        if key not in STATUSES:
            raise _fail(path, _key_line(text, key), f"unknown status {key!r}: expected [[xfail]] or [[skip]] tables")
        if not isinstance(value, list):
            raise _fail(path, _key_line(text, key), f"{key!r} must be written as [[{key}]] tables")
    headers = _headers(text)
    counters: dict[str, int] = defaultdict(int)
    entries, seen = [], {}
    for status, line in headers:
        index = counters[status]
        counters[status] += 1
        expectation = _check_entry(path, text, line, status, data[status][index])
        first = seen.setdefault((expectation.status, expectation.prefix, expectation.nodeid), line)
        if first != line:
            raise _fail(path, line, f"duplicate [[{status}]] {expectation.key!r}, first at line {first}")
        entries.append(expectation)
    return entries


def load_expectations(directory: Path) -> list[Expectation]:
    """Every entry of `directory/*.toml` (sorted by file name); [] when the directory does not exist."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return [e for path in sorted(directory.glob("*.toml")) for e in load_file(path)]


def _te_version(env: dict) -> Version | None:
    raw = env.get("te_version")
    if not raw or str(raw).startswith("absent"):
        return None
    try:
        return Version(str(raw))
    except InvalidVersion:
        return None


def device_kind(device: str | None) -> str:
    """"cuda: NVIDIA H100 x8" -> "cuda"; "cpu: x86_64" -> "cpu"."""
    return (device or "cpu").split(":")[0].strip().lower()


def applies(expectation: Expectation, env: dict) -> bool:
    """Do the entry's conditions hold in `env` ({"te_version": str | None, "device": str})?"""
    if expectation.device and device_kind(env.get("device")) != expectation.device:
        return False
    if expectation.te_version:
        version = _te_version(env)
        if version is None or not SpecifierSet(expectation.te_version).contains(version, prereleases=True):
            return False
    return True


def _covers(expectation: Expectation, case_id: str, nodeid: str) -> bool:
    if expectation.prefix is not None:
        return case_id.startswith(expectation.prefix)
    return nodeid.startswith(str(expectation.nodeid))


def match(expectations: list[Expectation], backend: str, case_id: str, nodeid: str, env: dict) -> Expectation | None:
    """The entry for this case, or None. The longest key wins, so a narrow entry overrides a broad one."""
    found = [e for e in expectations if e.backend == backend and _covers(e, case_id, nodeid) and applies(e, env)]
    return max(found, key=lambda e: len(e.key), default=None)


def current_env() -> dict:
    """The env for `match` on this machine (imports TE to learn its version, so call it once per run)."""
    from te_verify import environment

    return {"te_version": environment.transformer_engine_status(), "device": environment.device()}


def seen_in_rows(expectations: list[Expectation], rows: list[dict]) -> set[Expectation]:
    """Entries named by results rows (their `expectation` field): what the controller of an xdist run, which
    collects no items itself, passes to `stale`."""
    named = {(Path(r["expectation"]["file"]).name, r["expectation"]["status"], r["expectation"]["prefix"])
             for r in rows if r.get("expectation")}
    return {e for e in expectations if (Path(e.file).name, e.status, e.key) in named}


def stale(expectations: list[Expectation], seen: set, env: dict | None = None,
          backends: set[str] | None = None) -> list[Expectation]:
    """Entries that matched no collected case. With `env`, entries whose conditions do not hold here are
    inactive rather than stale; with `backends`, only entries of backends that ran are considered."""
    return [e for e in expectations if e not in seen
            and (env is None or applies(e, env)) and (backends is None or e.backend in backends)]


def stale_message(expectation: Expectation) -> str:
    return (f"stale expectation {expectation.where}: [[{expectation.status}]] {expectation.key!r} "
            f"matched no collected case of backend {expectation.backend!r}")


def mark_reason(expectation: Expectation) -> str:
    """The reason given to pytest's xfail/skip mark: the gap, its link and where the entry lives."""
    link = expectation.link or "untriaged, no upstream link"
    return f"known gap: {expectation.reason} ({link}) [{expectation.where} {expectation.key!r}]"


def mark_for(expectation: Expectation):
    """`pytest.mark.xfail(strict=True, reason=...)` or `pytest.mark.skip(reason=...)` for the entry."""
    import pytest

    if expectation.status == "skip":
        return pytest.mark.skip(reason=mark_reason(expectation))
    return pytest.mark.xfail(strict=True, reason=mark_reason(expectation))


def xpass_message(expectation: Expectation) -> str:
    """The failure of an unexpected pass: which entry to remove, and how."""
    return (f"UNEXPECTED PASS: the case is listed as a known gap by {expectation.where} "
            f"[[{expectation.status}]] {expectation.key!r} ({expectation.reason}) but it passed; remove that entry "
            f"(or run `te-verify expectations update <report-dir>/results.json`)")


@dataclass
class UpdateSummary:
    """What `update_from_results` changed."""

    # (file, case id) of every xfail entry added for a new failure.
    added: list[tuple[str, str]] = field(default_factory=list)
    # (file:line, key) of every entry removed because all its cases passed.
    removed: list[tuple[str, str]] = field(default_factory=list)
    # (file:line, key, still-failing case ids) of entries replaced by per-case entries (some cases now pass).
    narrowed: list[tuple[str, str, list[str]]] = field(default_factory=list)
    # (backend, case id) of failures that could not be mapped to a file (backend name is not a file stem).
    unmapped: list[tuple[str, str]] = field(default_factory=list)
    # Files written.
    files: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"added {file}: xfail {case!r} ({UNTRIAGED})" for file, case in self.added]
        out += [f"removed {where}: {key!r} (its cases pass now)" for where, key in self.removed]
        out += [f"narrowed {where}: {key!r} -> {len(ids)} case entries still failing" for where, key, ids in self.narrowed]
        out += [f"skipped backend {b!r}, case {c!r}: backend name is not a file stem" for b, c in self.unmapped]
        return out or ["expectations are up to date"]


def _toml_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string literal is a valid TOML basic string


def format_entry(status: str, fields: dict[str, str | None]) -> str:
    """One `[[status]]` table with keys in a fixed order."""
    order = ("prefix", "nodeid", "reason", "link", "te_version", "device")
    body = [f"{k} = {_toml_str(fields[k])}" for k in order if fields.get(k) is not None]
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
    lines = path.read_text().splitlines() if path.exists() else [f"# Known gaps of backend {path.stem!r}; see te_verify/expectations.py."]
    spans = _entry_spans(lines)
    for head in sorted(replace, reverse=True):
        start, end = spans[head]
        lines[start:end] = replace[head].splitlines() + ([""] if replace[head] else [])
    text = "\n".join(lines).rstrip() + "\n"
    for entry in append:
        text += "\n" + entry
    path.write_text(text)
    load_file(path)  # the rewritten file must load; a bug here must not leave a file that breaks the next run


def _plan(rows: list[dict], entries: list[Expectation], summary: UpdateSummary, directory: Path):
    """Per file: {header line: replacement text} and entries to append."""
    by_row = {(e.file, e.status, e.key): e for e in entries}
    by_name = {(Path(e.file).name, e.status, e.key): e for e in entries}
    outcomes: dict[Expectation, dict[str, str]] = defaultdict(dict)
    new_failures: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        exp_row, case_id = row.get("expectation"), row.get("case_id")
        if exp_row:
            key = (exp_row["file"], exp_row["status"], exp_row["prefix"])
            entry = by_row.get(key) or by_name.get((Path(key[0]).name, key[1], key[2]))
            if entry is not None and entry.status == "xfail" and row["outcome"] in ("xfailed", "xpassed"):
                outcomes[entry][case_id or row["nodeid"]] = row["outcome"]
        elif row["outcome"] in ("failed", "error") and case_id:
            if not _STEM.match(row["backend"]):
                summary.unmapped.append((row["backend"], case_id))
            elif any(e.backend == row["backend"] and _covers(e, case_id, row["nodeid"]) for e in entries):
                continue  # an entry already covers it (e.g. added by an earlier update from the same results)
            elif case_id not in new_failures[row["backend"]]:
                new_failures[row["backend"]].append(case_id)
    replace: dict[Path, dict[int, str]] = defaultdict(dict)
    for entry, results in outcomes.items():
        still = sorted(c for c, outcome in results.items() if outcome != "xpassed")
        if len(still) == len(results):
            continue
        replace[Path(entry.file)][entry.line] = "".join(
            format_entry("xfail", {**vars(entry), "prefix": case, "nodeid": None}) for case in still)
        if still:
            summary.narrowed.append((entry.where, entry.key, still))
        else:
            summary.removed.append((entry.where, entry.key))
    append: dict[Path, list[str]] = defaultdict(list)
    for backend, case_ids in new_failures.items():
        path = directory / f"{backend}.toml"
        for case_id in case_ids:
            append[path].append(format_entry("xfail", {"prefix": case_id, "reason": UNTRIAGED, "link": ""}))
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
