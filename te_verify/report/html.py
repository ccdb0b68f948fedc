"""report.html: one standalone page (inline CSS and JS, no network) rendered from results.json with Jinja2.

The page shows the run header, for a diff run the new failures / fixes / figure regressions on top, one matrix per
lane (torch, TE, distributed: its families by the backends that ran in it, the TE lane's columns split by recipe;
outcome counts and worst waste ratios per cell), and every case's details (spec, message, figures, duration, repro)
in <details> elements that a matrix click or a URL hash opens.
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


LANES = ("torch", "TE", "distributed")
DENSE = 0.5  # the share of filled cells from which a lane is drawn as a grid


def lane_of(row: dict) -> str:
    """The lane a row belongs to, from its spec (a TE config, a distributed config) or its family's name."""
    spec, family = row.get("spec") or {}, row.get("family") or ""
    if spec.get("dist") is not None or family.startswith("dist_"):
        return "distributed"
    if spec.get("te") is not None or family.startswith("te_"):
        return "TE"
    return "torch"


def column_of(row: dict, lane: str) -> str:
    """The matrix column of a row: its backend, and in the TE lane its recipe too ("te_eager / delayed")."""
    backend = row.get("backend") or "?"
    if lane != "TE":
        return backend
    te = (row.get("spec") or {}).get("te") or {}
    return f"{backend} / {te.get('recipe') or 'high precision'}"


@dataclass
class Lane:
    """One lane's matrix: its families by the columns that ran in it."""

    # "torch", "TE" or "distributed".
    name: str
    # Element id of its table.
    anchor: str
    families: list[str]
    columns: list[str]
    # (family, column) -> cell.
    cells: dict[tuple[str, str], Cell]

    @property
    def dense(self) -> bool:
        """Whether a families x columns grid is mostly filled; a sparse lane (the distributed one: each family runs
        on its own wrapper) is shown as one row per cell instead, so it fits the window."""
        return len(self.cells) >= DENSE * len(self.families) * len(self.columns)


def _columns(lane: str, seen: set[str], header: dict) -> list[str]:
    """Columns in the header's backend order, a backend's recipes together (high precision first)."""
    order = {b: i for i, b in enumerate(_order_backends(header, {c.split(" / ")[0] for c in seen}))}
    recipes = ("high precision", "delayed", "current", "block", "mxfp8", "nvfp4")
    return sorted(seen, key=lambda c: (order.get(c.split(" / ")[0], len(order)), c.split(" / ")[0],
                                       recipes.index(c.split(" / ")[1]) if " / " in c and c.split(" / ")[1] in recipes
                                       else len(recipes), c))


def build_matrix(results: dict) -> dict[str, Any]:
    """One matrix per lane (families x columns, only what ran in that lane), the cells and the totals."""
    header = results.get("header", {})
    tier, te_impl = header.get("tier"), chosen_te_impl(header.get("te_impl"))
    by_lane: dict[str, dict[tuple[str, str], Cell]] = defaultdict(dict)
    totals: dict[str, int] = defaultdict(int)
    ids: set[str] = set()
    for row in results["rows"]:
        lane = lane_of(row)
        family, column = row.get("family") or "?", column_of(row, lane)
        cell = by_lane[lane].setdefault((family, column), Cell(anchor(f"cell-{family}", column)))
        cell.counts[row["outcome"]] += 1
        totals[row["outcome"]] += 1
        update_worst_ratios(cell.ratios, row.get("figures") or {})
        cell.rows.append(_row_view(row, tier, ids, te_impl))
    lanes = []
    for name in LANES:
        cells = by_lane.get(name)
        if not cells:
            continue
        for cell in cells.values():
            cell.rows.sort(key=lambda r: (OUTCOMES.index(r["outcome"]) if r["outcome"] in OUTCOMES else 0,
                                          r["case_id"] or ""))
        lanes.append(Lane(name, anchor("matrix", name), sorted({f for f, _ in cells}),
                          _columns(name, {c for _, c in cells}, header), cells))
    return {"lanes": lanes, "totals": dict(totals), "outcomes": OUTCOMES, "labels": LABELS}


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
