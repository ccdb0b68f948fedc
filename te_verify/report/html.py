"""report.html: one standalone page (inline CSS and JS, no network) rendered from results.json with Jinja2.

The page shows the run header, for a diff run the new failures / fixes / figure regressions on top, the
families x backends matrix (outcome counts and worst waste ratios per cell), and every case's details
(spec, message, figures, duration, repro) in <details> elements that a matrix click or a URL hash opens.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from te_verify.report.repro import chosen_te_impl, pytest_command, repro_filename
from te_verify.report.results import ResultsError, load_results, write_atomic
from te_verify.report.summary import te_ran, update_worst_ratios

TEMPLATES = Path(__file__).parent / "templates"
OUTCOMES = ("passed", "failed", "error", "xpassed", "xfailed", "skipped")
FAILING = ("failed", "error", "xpassed")
LABELS = {"passed": "pass", "failed": "fail", "error": "error", "xpassed": "unexpected pass", "xfailed": "known gap",
          "skipped": "skip"}
# Waste ratios shown in every cell first; any other `*_ratio` figure follows.
MAIN_RATIOS = ("flops_ratio", "saved_bytes_ratio")


def anchor(prefix: str, text: str) -> str:
    """An element id made of URL-safe characters."""
    return f"{prefix}-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


@dataclass
class Cell:
    """One family x backend cell of the matrix."""

    # Element id of the cell's <details> list of cases.
    anchor: str
    # Outcome -> number of cases.
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # `*_ratio` figure -> worst (largest) value among the cell's cases.
    ratios: dict[str, float] = field(default_factory=dict)
    # Row views (see _row_view), failures first.
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        """The cell's colour: fail beats known gap beats pass beats skip."""
        for outcome, status in (("failed", "fail"), ("error", "fail"), ("xpassed", "fail"), ("xfailed", "gap"),
                                ("passed", "pass")):
            if self.counts.get(outcome):
                return status
        return "skip"

    @property
    def shown_ratios(self) -> list[tuple[str, float]]:
        keys = [k for k in MAIN_RATIOS if k in self.ratios] + sorted(k for k in self.ratios if k not in MAIN_RATIOS)
        return [(k.removesuffix("_ratio"), self.ratios[k]) for k in keys]


def _row_view(row: dict, tier: str | None, ids: set[str], te_impl: str | None = None) -> dict[str, Any]:
    element_id = anchor("case", row["nodeid"])
    while element_id in ids:
        element_id += "-"
    ids.add(element_id)
    failing = row["outcome"] in FAILING
    return {
        **row, "anchor": element_id, "failing": failing,
        "figures": dict(sorted((row.get("figures") or {}).items())),
        "spec_json": json.dumps(row.get("spec"), indent=1) if row.get("spec") is not None else None,
        "pytest_command": pytest_command(row, tier, te_impl=te_impl),
        "repro": f"repro/{repro_filename(row)}" if failing and row.get("spec") else None,
    }


def _order_backends(header: dict, seen: set[str]) -> list[str]:
    """Backends of the header in its order (available or not), then wrappers and external backends."""
    listed = [b for b in header.get("backends", {}) if b in seen]
    return listed + sorted(seen - set(listed))


def build_matrix(results: dict) -> dict[str, Any]:
    """Families, backends, cells and totals for the template."""
    tier = results.get("header", {}).get("tier")
    te_impl = chosen_te_impl(results.get("header", {}).get("te_impl"))
    cells: dict[tuple[str, str], Cell] = {}
    totals: dict[str, int] = defaultdict(int)
    ids: set[str] = set()
    for row in results["rows"]:
        family, backend = row.get("family") or "?", row.get("backend") or "?"
        cell = cells.setdefault((family, backend), Cell(anchor(f"cell-{family}", backend)))
        cell.counts[row["outcome"]] += 1
        totals[row["outcome"]] += 1
        update_worst_ratios(cell.ratios, row.get("figures") or {})
        cell.rows.append(_row_view(row, tier, ids, te_impl))
    for cell in cells.values():
        cell.rows.sort(key=lambda r: (OUTCOMES.index(r["outcome"]) if r["outcome"] in OUTCOMES else 0, r["case_id"] or ""))
    return {
        "families": sorted({f for f, _ in cells}),
        "backends": _order_backends(results.get("header", {}), {b for _, b in cells}),
        "cells": cells, "totals": dict(totals), "outcomes": OUTCOMES, "labels": LABELS,
    }


def format_figure(value: Any) -> str:
    """Ratios with 3 significant digits, counts and bytes with thousands separators, the rest as JSON."""
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1000:
        value = int(value)
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return json.dumps(value)


HEADER_DEFAULTS = {"run_id": "?", "tier": "?", "started": "", "finished": "", "argv": [], "versions": {},
                   "device": "?", "te_impl": {"name": "?", "why": ""}, "compat": [], "backends": {}}


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fig"] = format_figure
    env.filters["anchor"] = lambda nodeid: anchor("case", nodeid)
    return env


def render_html(results: dict, out_path: Path, diff: dict | None = None) -> Path:
    """Write the standalone report page for a results.json payload (and optionally its diff) to out_path."""
    template = _environment().get_template("report.html.j2")
    header = {**HEADER_DEFAULTS, **results.get("header", {})}
    page = template.render(header=header, te_ran=te_ran(header), diff=diff, **build_matrix(results))
    write_atomic(Path(out_path), page)
    return Path(out_path)


def main(argv: list[str] | None = None) -> int:
    """`te-verify report html RESULTS [--diff DIFF_JSON] [--out PATH]`: re-render a run's page."""
    parser = argparse.ArgumentParser(prog="te-verify report html", description="render report.html from results.json")
    parser.add_argument("results", type=Path, help="results.json of a run")
    parser.add_argument("--diff", type=Path, default=None, help="diff.json from `te-verify report diff`, shown on top")
    parser.add_argument("--out", type=Path, default=None, help="default: report.html next to RESULTS")
    args = parser.parse_args(argv)
    try:
        results = load_results(args.results)
        diff = json.loads(args.diff.read_text()) if args.diff else None
    except (ResultsError, OSError, json.JSONDecodeError) as exc:
        print(f"te-verify report html: {exc}", file=sys.stderr)
        return 2
    print(render_html(results, args.out or args.results.parent / "report.html", diff=diff))
    return 0
