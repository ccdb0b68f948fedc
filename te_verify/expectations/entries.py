"""Known upstream gaps as data: `expectations/<backend>.toml`, one file per backend or wrapper.

    # expectations/thunder_te.toml
    [[xfail]]
    prefix = "lin4-w32.32.32.32.32-freeze1010"    # case-id prefix; or glob = "lin4-*-fp8delayed" (fnmatch on the
                                                  # case id); or nodeid = "<pytest node-id prefix>"
    checks = ["gemm_work", "fp8_copies"]          # the checks the gap is about: every other check still judges
    reason = "thunder's TE executor computes wgrad for frozen weights"
    link = "https://github.com/Lightning-AI/lightning-thunder/issues/2076"
    failure = "(frozen weight): 1 wgrad GEMM"     # optional: text those checks' failure must contain
    family = "te_peft"                            # optional: only cases of this family (case ids recur across them)
    exclude = "*-freeze1111-*"                    # optional, with glob: case ids the pattern must not cover (or a list)
    device = "cuda"                               # optional: "cpu" or "cuda"
    te_version = ">=2.9,<3"                       # optional: a version range; never holds when TE is absent
    torch_version = ">=2.14"                      # optional: a torch version range (local labels like +cpu ignored)
    te_capability = ["sm89", "sm90"]              # optional: the compute capabilities (GPU's or emulated) it holds at

    [[skip]]
    prefix = "lin2-"
    reason = "..."

An entry applies to the cases whose backend is the file's stem; every entry covering a case applies (two gaps of
one case each cover their own checks). How a case is judged under its entries is te_verify.expectations.judge: a known
gap iff exactly the entries' checks fail as described; strict (a covered check that passes fails the case, naming
the entry). A check name that does not exist (te_verify.checks.names) is refused when the file is loaded. Entries
that match no collected case are stale (`stale`). te_verify.expectations.update rewrites the files from a run's
results, like `wpt update-expectations`. A malformed file raises ExpectationsError with a
one-line message naming the file and line.
"""
from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from te_verify.checks.names import CHECKS, unknown_check_message

STATUSES = ("xfail", "skip")
KEYS = {"prefix", "glob", "exclude", "nodeid", "family", "reason", "link", "failure", "te_version", "torch_version",
        "device", "te_capability", "checks", "elements"}
SELECTORS = ("prefix", "glob", "nodeid")
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
    # Case-id prefix (matched against spec.id), or None when the entry is keyed otherwise.
    prefix: str | None
    # pytest node-id prefix, or None.
    nodeid: str | None
    # Why the gap exists; shown in the report and in pytest's xfail/skip reason.
    reason: str
    # Upstream issue/PR URL; "" for entries added by `expectations update` that nobody triaged yet.
    link: str = ""
    # Optional TE version range (PEP 440 specifier set, e.g. ">=2.9,<3").
    te_version: str | None = None
    # Optional torch version range: TE's torch.compile path runs from torch 2.14 on (te_verify.te.compile_path).
    torch_version: str | None = None
    # Optional device kind the entry is limited to: "cpu" or "cuda".
    device: str | None = None
    # Optional compute capabilities TE runs at ("sm90"; the emulated one on CPU) the entry is limited to: TE takes
    # other paths on Blackwell (sm100) than on Hopper.
    te_capability: tuple[str, ...] = ()
    # Case-id pattern (fnmatch), or None.
    glob: str | None = None
    # Text the failure message must contain for the failure to be this gap (xfail only), or None.
    failure: str | None = None
    # Case family the entry is limited to, or None.
    family: str | None = None
    # With glob: case-id pattern of cases the entry does not cover, or None.
    exclude: str | tuple[str, ...] | None = None
    # The checks (Verdict.check names) the gap is about; xfail entries name at least one, skip entries none.
    checks: tuple[str, ...] = ()
    # The elements (parameters by qualified name) the gap is about, where its checks itemize their problems per
    # element (grad_parity, return_contract): a problem of another element fails the case beside the gap. Empty: the
    # gap covers its checks whole.
    elements: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return next(v for v in (self.prefix, self.glob, self.nodeid) if v is not None)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def to_row(self) -> dict[str, str]:
        """The `expectation` field of a results.json row."""
        return {"file": self.file, "line": self.line, "prefix": self.key, "status": self.status, "reason": self.reason,
                "link": self.link, "checks": list(self.checks)}


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
        if key in ("checks", "elements"):
            _check_names(path, _key_line(text, key, line), value, key)
        elif key in ("exclude", "te_capability") and isinstance(value, list):
            _check_names(path, _key_line(text, key, line), value, key)
        elif not isinstance(value, str):
            raise _fail(path, _key_line(text, key, line), f"{key} must be a string, got {value!r}")
    selectors = [k for k in SELECTORS if k in entry]
    if len(selectors) != 1:
        raise _fail(path, line, f"[[{status}]] needs exactly one of 'prefix' (case id), 'glob' (case-id pattern) or 'nodeid'")
    name = entry[selectors[0]]
    if not entry.get("reason", "").strip():
        raise _fail(path, line, f"[[{status}]] {name!r}: missing 'reason'")
    if status == "xfail" and "link" not in entry:
        raise _fail(path, line, f"[[xfail]] {name!r}: missing 'link' (upstream URL)")
    if "exclude" in entry and "glob" not in entry:
        raise _fail(path, _key_line(text, "exclude", line), f"[[{status}]] {name!r}: 'exclude' narrows a 'glob' entry only")
    for key in ("failure", "checks", "elements"):
        if status == "skip" and key in entry:
            raise _fail(path, _key_line(text, key, line), f"[[skip]] {name!r}: {key!r} applies to xfail entries only")
    if status == "xfail" and "checks" not in entry:
        raise _fail(path, line, f"[[xfail]] {name!r}: missing 'checks' (the check names the gap is about, e.g. "
                                f"checks = [\"grad_parity\"])")
    link = entry.get("link", "")
    if link and not link.startswith(("http://", "https://")):
        raise _fail(path, _key_line(text, "link", line), f"link {link!r} is not an http(s) URL")
    if "device" in entry and entry["device"] not in DEVICES:
        raise _fail(path, _key_line(text, "device", line), f"device {entry['device']!r}: expected one of {DEVICES}")
    capabilities = entry.get("te_capability", [])
    capabilities = [capabilities] if isinstance(capabilities, str) else capabilities
    if not isinstance(capabilities, list) or not all(isinstance(c, str) and re.fullmatch(r"sm\d+", c)
                                                      for c in capabilities):
        raise _fail(path, _key_line(text, "te_capability", line),
                    f"te_capability {entry['te_capability']!r}: expected a capability like \"sm90\" or a list of them")
    for key in ("te_version", "torch_version"):
        try:
            SpecifierSet(entry.get(key, ""))
        except InvalidSpecifier:
            raise _fail(path, _key_line(text, key, line),
                        f"{key} {entry[key]!r} is not a version range like '>=2.9,<3'") from None
    return Expectation(file=str(path), line=line, backend=path.stem, status=status, prefix=entry.get("prefix"),
                       nodeid=entry.get("nodeid"), reason=entry["reason"], link=link,
                       te_version=entry.get("te_version"), torch_version=entry.get("torch_version"),
                       device=entry.get("device"), te_capability=tuple(capabilities), glob=entry.get("glob"),
                       failure=entry.get("failure"),
                       family=entry.get("family"),
                       exclude=tuple(entry["exclude"]) if isinstance(entry.get("exclude"), list) else entry.get("exclude"),
                       checks=tuple(entry.get("checks", ())), elements=tuple(entry.get("elements", ())))


def _check_names(path: Path, line: int, value: Any, key: str = "checks") -> None:
    what = {"checks": "check names", "exclude": "case-id patterns", "te_capability": "capabilities"}.get(
        key, "element names (a parameter's qualified name)")
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise _fail(path, line, f"{key} must be a non-empty list of {what}, got {value!r}")
    if len(set(value)) != len(value):
        raise _fail(path, line, f"{key} {value!r} names one twice")
    unknown = [name for name in value if key == "checks" and name not in CHECKS]
    if unknown:
        raise _fail(path, line, f"checks: {unknown_check_message(unknown[0])}")


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
    entries, seen = [], defaultdict(list)
    for status, line in headers:
        index = counters[status]
        counters[status] += 1
        expectation = _check_entry(path, text, line, status, data[status][index])
        _check_unique(path, line, expectation, seen)
        entries.append(expectation)
    return entries


def _check_unique(path: Path, line: int, e: Expectation, seen: dict) -> None:
    """One entry per key, family, versions, device and checks at any capability: entries for the same cases at
    disjoint capabilities (a gap measured otherwise at sm90 and at sm100) are two, an overlap is a duplicate."""
    same = seen[(e.status, e.key, e.family, e.te_version, e.torch_version, e.device, e.checks)]
    for capabilities, first in same:
        if not capabilities or not e.te_capability or set(capabilities) & set(e.te_capability):
            raise _fail(path, line, f"duplicate [[{e.status}]] {e.key!r}, first at line {first}")
    same.append((e.te_capability, line))


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
    """Do the entry's conditions hold in `env` ({"te_version": str | None, "device": str, "torch_version": str,
    "te_capability": str})?"""
    if expectation.device and device_kind(env.get("device")) != expectation.device:
        return False
    if expectation.te_capability and env.get("te_capability") not in expectation.te_capability:
        return False
    if expectation.te_version:
        version = _te_version(env)
        if version is None or not SpecifierSet(expectation.te_version).contains(version, prereleases=True):
            return False
    torch_version = Version(str(env.get("torch_version") or "0")).public
    return (not expectation.torch_version
            or SpecifierSet(expectation.torch_version).contains(torch_version, prereleases=True))


def _covers(expectation: Expectation, case_id: str, nodeid: str, family: str | None = None) -> bool:
    if expectation.family is not None and family != expectation.family:
        return False
    if expectation.prefix is not None:
        return case_id.startswith(expectation.prefix)
    if expectation.glob is not None:
        excludes = (expectation.exclude,) if isinstance(expectation.exclude, str) else expectation.exclude or ()
        excluded = any(fnmatch.fnmatchcase(case_id, pattern) for pattern in excludes)
        return fnmatch.fnmatchcase(case_id, expectation.glob) and not excluded
    return nodeid.startswith(str(expectation.nodeid))


def covering(expectations: list[Expectation], backend: str, case_id: str, nodeid: str, env: dict,
             family: str | None = None) -> list[Expectation]:
    """Every entry covering this case whose conditions hold here, in file order."""
    return [e for e in expectations
            if e.backend == backend and _covers(e, case_id, nodeid, family) and applies(e, env)]


def skip_entry(entries: list[Expectation]) -> Expectation | None:
    """The skip entry among a case's entries (the longest key when several), or None: a skipped case runs no check."""
    return max((e for e in entries if e.status == "skip"), key=lambda e: len(e.key), default=None)


def current_env() -> dict:
    """The env for `match`: the TE version whose Python serves the TE families (None when none does), torch's."""
    import torch

    from te_verify import device as run_device
    from te_verify.te.api import transformer_engine_version
    from te_verify.te import api as te_api

    version = transformer_engine_version() if te_api.active().runs_te_python else None
    return {"te_version": version, "device": run_device.describe(), "torch_version": torch.__version__,
            "te_capability": te_api.capability()}


def seen_in_rows(expectations: list[Expectation], rows: list[dict]) -> set[Expectation]:
    """Entries named by results rows (their `gaps`, or the older single `expectation` field): what the controller
    of an xdist run, which collects no items itself, passes to `stale`."""
    rows_entries = [g for r in rows for g in (r.get("gaps") or ([r["expectation"]] if r.get("expectation") else []))]
    rows_entries += [gap for r in rows for gap in r.get("drawn_gaps", [])]  # met by specs a test drew
    named = {(Path(e["file"]).name, e.get("line"), e["prefix"]) for e in rows_entries}
    return {e for e in expectations if (Path(e.file).name, e.line, e.key) in named
            or (Path(e.file).name, None, e.key) in named}


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
