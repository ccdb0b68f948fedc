"""`te-verify report diff OLD NEW`: what changed between two runs (e.g. last night and tonight).

Version changes of what ran (the header's `versions`: "deepspeed 0.19.8 -> 0.19.9"), new failures, fixed cases,
new/removed cases and figure regressions beyond thresholds (any `*_ratio`, saved bytes, peak bytes, duration).
Prints markdown, writes diff.json and diff.md next to NEW, re-renders NEW's report.html with the diff on top, and
exits 1 when anything regressed so a nightly job can alert (a version change alone is not a regression).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from te_verify.report.results import ResultsError, load_results, write_atomic

FAILING = ("failed", "error", "xpassed")  # xpassed: a strict xfail that passed fails the run
BYTES_FIGURES = ("saved_bytes_actual", "peak_bytes", "peak_backward_bytes", "collective_bytes_actual")


@dataclass(frozen=True)
class Thresholds:
    """How much a figure may rise before it is a regression."""

    # Absolute rise allowed for any `*_ratio` figure (actual / required; 1.0 is the goal).
    ratio_abs: float = 0.05
    # Relative rise allowed for byte figures (BYTES_FIGURES).
    bytes_rel: float = 0.10
    # Duration is a regression only if it rises by more than this fraction...
    duration_rel: float = 0.5
    # ...and by more than this many seconds (short cases jitter).
    duration_abs: float = 1.0


def _key(row: dict) -> str:
    return row["nodeid"]


def _brief(row: dict | None) -> dict | None:
    if row is None:
        return None
    reason = (row.get("reason") or "").strip()
    return {"nodeid": row["nodeid"], "case_id": row.get("case_id"), "family": row.get("family"),
            "backend": row.get("backend"), "outcome": row["outcome"], "reason": reason.splitlines()[0] if reason else ""}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _figure_limit(name: str, old: float, t: Thresholds) -> tuple[float, str] | None:
    """(largest allowed new value, threshold text) for a watched figure; None for figures not watched."""
    if name.endswith("_ratio"):
        return old + t.ratio_abs, f"+{t.ratio_abs:g} abs"
    if name in BYTES_FIGURES:
        return old * (1 + t.bytes_rel), f"+{t.bytes_rel:.0%}"
    if name == "duration":
        return max(old * (1 + t.duration_rel), old + t.duration_abs), f"+{t.duration_rel:.0%} and +{t.duration_abs:g}s"
    return None


def figure_regressions(old: dict, new: dict, t: Thresholds) -> list[dict]:
    """Watched figures of one case that rose beyond their threshold."""
    old_figs = {**(old.get("figures") or {}), "duration": old.get("duration")}
    new_figs = {**(new.get("figures") or {}), "duration": new.get("duration")}
    found = []
    for name in sorted(set(old_figs) & set(new_figs)):
        before, after = _number(old_figs[name]), _number(new_figs[name])
        limit = _figure_limit(name, before, t) if before is not None and after is not None else None
        if limit is not None and after > limit[0]:
            found.append({**_brief(new), "figure": name, "old": before, "new": after,
                          "delta": after - before, "threshold": limit[1]})
    return found


def _run_info(results: dict) -> dict:
    header = results.get("header", {})
    return {k: header.get(k) for k in ("run_id", "started", "tier", "device")}


def version_changes(old: dict, new: dict) -> list[dict]:
    """Every package whose version differs between the two runs' headers (one absent from a header: "absent")."""
    before = old.get("header", {}).get("versions") or {}
    after = new.get("header", {}).get("versions") or {}
    return [{"package": name, "old": before.get(name, "absent"), "new": after.get(name, "absent")}
            for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]


def version_line(change: dict) -> str:
    """"deepspeed 0.19.8 -> 0.19.9"."""
    return f"{change['package']} {change['old']} -> {change['new']}"


def diff_results(old: dict, new: dict, thresholds: Thresholds | None = None) -> dict:
    """Compare two results payloads row by row (keyed by node id)."""
    t = thresholds or Thresholds()
    old_rows = {_key(r): r for r in old["rows"]}
    new_rows = {_key(r): r for r in new["rows"]}
    both = [k for k in new_rows if k in old_rows]
    new_failures = [{**_brief(new_rows[k]), "old_outcome": old_rows[k]["outcome"] if k in old_rows else None}
                    for k in new_rows if new_rows[k]["outcome"] in FAILING
                    and (k not in old_rows or old_rows[k]["outcome"] not in FAILING)]
    fixed = [{**_brief(new_rows[k]), "old_outcome": old_rows[k]["outcome"]} for k in both
             if old_rows[k]["outcome"] in FAILING and new_rows[k]["outcome"] == "passed"]
    regressions = [reg for k in both for reg in figure_regressions(old_rows[k], new_rows[k], t)]
    return {
        "old": _run_info(old), "new": _run_info(new), "thresholds": asdict(t),
        "versions_changed": version_changes(old, new),
        "new_failures": new_failures, "fixed": fixed,
        "new_cases": [_brief(new_rows[k]) for k in new_rows if k not in old_rows],
        "removed_cases": [_brief(old_rows[k]) for k in old_rows if k not in new_rows],
        "regressions": regressions,
        "regressed": bool(new_failures or regressions),
    }


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def render_markdown(diff: dict) -> str:
    old, new = diff["old"], diff["new"]
    verdict = "REGRESSED" if diff["regressed"] else "no regressions"
    lines = [f"# te_verify diff: {old.get('run_id')} -> {new.get('run_id')}: {verdict}", "",
             f"{len(diff['new_failures'])} new failures, {len(diff['fixed'])} fixed, "
             f"{len(diff['regressions'])} figure regressions, {len(diff['new_cases'])} new cases, "
             f"{len(diff['removed_cases'])} removed cases, {len(diff.get('versions_changed', []))} version changes",
             ""]
    sections = [
        ("Versions changed", diff.get("versions_changed", []), version_line),
        ("New failures", diff["new_failures"], lambda r: f"`{r['nodeid']}`: {r['old_outcome'] or 'new'} -> {r['outcome']}: {r['reason']}"),
        ("Fixed", diff["fixed"], lambda r: f"`{r['nodeid']}`: {r['old_outcome']} -> {r['outcome']}"),
        ("Figure regressions", diff["regressions"],
         lambda r: f"`{r['nodeid']}`: {r['figure']} {_fmt(r['old'])} -> {_fmt(r['new'])} (allowed {r['threshold']})"),
        ("New cases", diff["new_cases"], lambda r: f"`{r['nodeid']}`: {r['outcome']}"),
        ("Removed cases", diff["removed_cases"], lambda r: f"`{r['nodeid']}`"),
    ]
    for title, items, line in sections:
        if items:
            lines += [f"## {title}", "", *(f"- {line(item)}" for item in items), ""]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="te-verify report diff", description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="results.json of the earlier run")
    parser.add_argument("new", type=Path, help="results.json of the later run")
    defaults = Thresholds()
    parser.add_argument("--ratio-abs", type=float, default=defaults.ratio_abs, help="allowed rise of *_ratio figures")
    parser.add_argument("--bytes-rel", type=float, default=defaults.bytes_rel, help="allowed relative rise of byte figures")
    parser.add_argument("--duration-rel", type=float, default=defaults.duration_rel, help="allowed relative rise of duration")
    parser.add_argument("--duration-abs", type=float, default=defaults.duration_abs, help="allowed rise of duration, seconds")
    parser.add_argument("--out-dir", type=Path, default=None, help="where diff.json/diff.md go (default: NEW's folder)")
    parser.add_argument("--no-html", action="store_true", help="do not re-render report.html with the diff")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit 0: nothing regressed; 1: new failures or figure regressions; 2: unreadable input."""
    args = _parser().parse_args(argv)
    try:
        old, new = load_results(args.old), load_results(args.new)
    except ResultsError as exc:
        print(f"te-verify report diff: {exc}", file=sys.stderr)
        return 2
    thresholds = Thresholds(args.ratio_abs, args.bytes_rel, args.duration_rel, args.duration_abs)
    diff = diff_results(old, new, thresholds)
    markdown = render_markdown(diff)
    out_dir = args.out_dir or args.new.parent
    write_atomic(out_dir / "diff.json", json.dumps(diff, indent=1, sort_keys=True))
    write_atomic(out_dir / "diff.md", markdown)
    if not args.no_html:
        from te_verify.report.html import render_html

        render_html(new, out_dir / "report.html", diff=diff)
    print(markdown)
    return 1 if diff["regressed"] else 0


if __name__ == "__main__":
    sys.exit(main())
