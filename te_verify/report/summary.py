"""summary.md: the families x backends matrix with outcome counts and the worst waste ratio per cell."""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from te_verify.report.stream import incomplete_line

SHOWN = ("passed", "failed", "xfailed", "skipped", "error", "xpassed")


def update_worst_ratios(worst: dict[str, float], figures: dict[str, Any]) -> None:
    """Keep, per `*_ratio` figure, the worst (largest) numeric value seen in a cell."""
    for key, value in figures.items():
        if key.endswith("_ratio") and isinstance(value, (int, float)):
            worst[key] = max(value, worst.get(key, value))


def cells(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(family, backend) -> {"counts": {outcome: n}, "ratios": {figure: worst}}."""
    table: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: {"counts": defaultdict(int), "ratios": {}})
    for row in rows:
        cell = table[(row.get("family", "?"), row.get("backend", "?"))]
        cell["counts"][row["outcome"]] += 1
        update_worst_ratios(cell["ratios"], row.get("figures") or {})
    return table


def _cell_text(cell: dict[str, Any]) -> str:
    counts = ", ".join(f"{cell['counts'][o]} {o}" for o in SHOWN if cell["counts"].get(o))
    return counts or "-"


def _ratio_text(cell: dict[str, Any]) -> str:
    ratios = cell["ratios"]
    return ", ".join(f"{k.removesuffix('_ratio')} {v:.2f}" for k, v in sorted(ratios.items())) or "-"


def known_gap_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One table row per known-gap entry that held: its cases and the case-checks it covers (a gap covers only the
    checks it names; every other check of those cases judged)."""
    gaps: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        if row["outcome"] != "xfailed":
            continue
        states = row.get("checks") or {}
        for gap in row.get("gaps") or ([row["expectation"]] if row.get("expectation") else []):
            key = (gap["file"], gap.get("line"), gap["prefix"])
            entry = gaps.setdefault(key, {"gap": gap, "cases": 0, "covered": 0, "judged": 0})
            entry["cases"] += 1
            entry["covered"] += sum(states.get(name) == "known gap" for name in gap.get("checks", []))
            entry["judged"] += sum(name not in gap.get("checks", []) for name in states)
    if not gaps:
        return []
    lines = ["", "## Known gaps (each covers only the checks it names)", "",
             "| entry | checks | cases | case-checks covered | other case-checks still judged | link |", "|---|---|---|---|---|---|"]
    for (file, line, prefix), entry in sorted(gaps.items(), key=lambda kv: (-kv[1]["covered"], str(kv[0]))):
        gap = entry["gap"]
        lines.append(f"| `{file.split('/')[-1]}:{line}` {prefix} | {', '.join(gap.get('checks', [])) or '-'} | "
                     f"{entry['cases']} | {entry['covered']} | {entry['judged']} | {gap.get('link') or 'untriaged'} |")
    return lines


def _incomplete_lines(header: dict[str, Any]) -> list[str]:
    """A partial run's mark and the cases that never ran (te_verify.report.stream)."""
    line = incomplete_line(header)
    if line is None:
        return []
    return ["", f"**{line}**; without a row (`te-verify run --resume DIR` runs them):",
            *[f"- `{nodeid}`" for nodeid in header["incomplete"]["never_ran"]]]


def te_ran(header: dict[str, Any]) -> str:
    """The TE implementation's name and what of it ran (TE's real Python, an emulation below it)."""
    impl = header.get("te_impl") or {}
    name, ran = str(impl.get("name")), impl.get("ran")
    return name if not ran else ran if ran.startswith(name) else f"{name} ({ran})"


def selection_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What the pr tier's choice kept per family x backend (te_verify.matrix.selection): candidates, chosen, pairs, and how
    many chosen cases skipped (a skipped case covers none of its pairs: a budget skip is visible here)."""
    kept = {(r.get("family"), r.get("backend")): r["selection"] for r in rows if r.get("selection")}
    if not kept:
        return []
    skipped = Counter((r.get("family"), r.get("backend")) for r in rows
                      if r.get("selection") and r["outcome"] == "skipped")
    chosen, candidates = sum(k["chosen"] for k in kept.values()), sum(k["candidates"] for k in kept.values())
    lines = ["", f"## The pr tier, chosen: {chosen} of {candidates} candidates cover every pair of factor values "
                 f"of their family x backend ({sum(k['pairs'] for k in kept.values())} pairs), "
                 f"{sum(skipped.values())} of them skipped", "",
             "| family | backend | chosen / candidates | pairs covered | skipped | measured s |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {f} | {b} | {k['chosen']} / {k['candidates']} | {k['pairs']} | {skipped[(f, b)]} | {k['seconds']} |"
              for (f, b), k in sorted(kept.items())]
    return lines


def te_compile_lines(header: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """What torch needs for TE's compile path, and per backend how many rows ran it ("compiled") or fell back."""
    paths: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        path = row.get("figures", {}).get("te_compile_path")
        if path:
            paths[row["backend"]][path] += 1
    lines = [f"TE torch.compile: {header['te_compile']}"] if header.get("te_compile") else []
    return lines + [f"TE's compile path in {backend} rows: " + ", ".join(f"{n} {p}" for p, n in sorted(c.items()))
                    for backend, c in sorted(paths.items())]


def render_summary(results: dict[str, Any]) -> str:
    header, rows = results["header"], results["rows"]
    table = cells(rows)
    families = sorted({f for f, _ in table})
    backends = sorted({b for _, b in table})
    totals = defaultdict(int)
    for row in rows:
        totals[row["outcome"]] += 1
    lines = [
        f"# te_verify summary: tier {header.get('tier')}, run {header.get('run_id')}",
        "",
        "Totals: " + ", ".join(f"{totals[o]} {o}" for o in SHOWN if totals.get(o)),
        *_incomplete_lines(header),
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in header.get("versions", {}).items()),
        f"Device: {header.get('device')} (rows on {', '.join(header.get('devices') or ['?'])}); "
        f"TE implementation: {te_ran(header)}",
        *([f"Shard {header['shard']}"] if header.get("shard") else []),
        *([f"Merged from shards {', '.join(header['shards'])}"] if header.get("shards") else []),
        "Compatibility steps: " + ("; ".join(header.get("compat") or []) or "none"),
        *[f"WARNING: unmeasured version: {line}" for line in header.get("unmeasured_versions") or []],
        *([f"Passes: {', '.join(header['passes'])} (emulated capability and environment; te_verify/passes.py)"]
          if header.get("passes") else []),
        *te_compile_lines(header, rows),
        "",
        "## Outcomes (family x backend)",
        "",
        "| family | " + " | ".join(backends) + " |",
        "|---|" + "---|" * len(backends),
    ]
    for family in families:
        row = [_cell_text(table[(family, b)]) if (family, b) in table else "" for b in backends]
        lines.append(f"| {family} | " + " | ".join(row) + " |")
    lines += ["", "## Worst waste ratio (actual / required; 1.00 is the goal)", "",
              "| family | " + " | ".join(backends) + " |", "|---|" + "---|" * len(backends)]
    for family in families:
        row = [_ratio_text(table[(family, b)]) if (family, b) in table else "" for b in backends]
        lines.append(f"| {family} | " + " | ".join(row) + " |")
    overheads = [r["figures"]["overhead_s"] for r in rows if isinstance(r.get("figures", {}).get("overhead_s"), (int, float))]
    if overheads:
        lines += ["", f"Distributed rank-pool overhead per case: median {statistics.median(overheads):.4f} s, "
                      f"max {max(overheads):.4f} s over {len(overheads)} cases (round trip minus the slowest rank's compute; pool start-up excluded)"]
    lines += known_gap_lines(rows)
    lines += selection_lines(rows)
    failures = [r for r in rows if r["outcome"] in ("failed", "error", "xpassed")]
    if failures:
        lines += ["", "## Failures", ""]
        lines += [f"- `{r['nodeid']}`: {r.get('reason', '').splitlines()[0] if r.get('reason') else ''}" for r in failures]
    return "\n".join(lines) + "\n"
