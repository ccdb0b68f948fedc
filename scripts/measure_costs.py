"""Rewrite te_verify/data/pr_costs.json, the measured cost of every pr-tier case that te_verify.matrix.selection weighs
when it chooses the pr tier, from a run of the pr tier's candidates.

    .venv/bin/python -m te_verify.cli run --tier pr --report-dir /tmp/prall -p no:randomly --pr-candidates
    .venv/bin/python scripts/measure_costs.py /tmp/prall
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from te_verify.matrix.selection import COSTS, write_costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="a report folder of a pr run over every candidate")
    args = parser.parse_args()
    rows = json.loads((args.report / "results.json").read_text())["rows"]
    print(f"{write_costs(rows)} case costs written to {COSTS}")


if __name__ == "__main__":
    main()
