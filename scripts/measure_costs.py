"""Rewrite te_verify/data/pr_costs.json, the measured cost of every pr-tier case that te_verify.matrix.selection weighs
when it chooses the pr tier, from a run of the pr tier's candidates; or, with --durations, te_verify/data/
pr_durations.json, the seconds of every case of the main job that `--case-order cost` (the main job's order) reads,
from the main job's report.

    .venv/bin/python -m te_verify.cli run --tier pr --report-dir /tmp/prall -p no:randomly --pr-candidates
    .venv/bin/python scripts/measure_costs.py /tmp/prall
    .venv/bin/python scripts/measure_costs.py --durations reports/<the main job's run>  (or its passes/*)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from te_verify.matrix.case_order import DURATIONS, write_durations
from te_verify.matrix.selection import COSTS, write_costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", type=Path, nargs="+", help="report folders of a pr run over every candidate (or, "
                        "with --durations, of the main job: its merged report, or its passes' folders)")
    parser.add_argument("--durations", action="store_true", help="write the main job's durations table instead")
    args = parser.parse_args()
    rows = [row for report in args.reports for row in json.loads((report / "results.json").read_text())["rows"]]
    if args.durations:
        print(f"{write_durations(rows)} case durations written to {DURATIONS}")
    else:
        print(f"{write_costs(rows)} case costs written to {COSTS}")


if __name__ == "__main__":
    main()
