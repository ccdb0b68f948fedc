"""Two runs' verdicts side by side, per nodeid and per check: the proof that a verdict is the same in any order (a
collected and a `--case-order reverse` nightly) or across a change that must not move it.

    .venv/bin/python scripts/compare_verdicts.py A/rows.jsonl B/rows.jsonl [--only cases/test_te_]

Prints the rows and check verdicts compared and every difference (nodeid, check, A's verdict, B's), and rows only one
run has; exits 1 when any differs. `te-verify report diff` judges a night against the last (regressions, figures);
this judges equality.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from te_verify.report.stream import read_stream


def verdict_rows(path: Path, only: str) -> dict[str, dict]:
    """nodeid -> its row (read_stream keeps the last row written for a nodeid, as a resumed run may write two)."""
    return {row["nodeid"]: row for row in read_stream(path)["rows"] if row["nodeid"].startswith(only)}


def differences(a: dict[str, dict], b: dict[str, dict]) -> tuple[int, list[str]]:
    """(check verdicts compared, one line per difference) over the nodeids both runs have."""
    compared, lines = 0, []
    for nodeid in sorted(a.keys() & b.keys()):
        ra, rb = a[nodeid], b[nodeid]
        if ra["outcome"] != rb["outcome"]:
            lines.append(f"{nodeid}: outcome {ra['outcome']} vs {rb['outcome']} ({rb.get('reason') or ra.get('reason')})"
                         [:400])
        ca, cb = ra.get("checks") or {}, rb.get("checks") or {}
        for check in sorted(ca.keys() | cb.keys()):
            compared += 1
            if ca.get(check) != cb.get(check):
                lines.append(f"{nodeid}: check {check} {ca.get(check, 'absent')} vs {cb.get(check, 'absent')}")
    return compared, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--only", default="", help="compare only nodeids starting with this")
    args = parser.parse_args()
    a, b = verdict_rows(args.a, args.only), verdict_rows(args.b, args.only)
    compared, lines = differences(a, b)
    only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    print(f"rows: {len(a.keys() & b.keys()):,} in both, {len(only_a):,} only in A, {len(only_b):,} only in B; "
          f"check verdicts compared: {compared:,}; differences: {len(lines):,}")
    for line in lines:
        print("  " + line)
    for name, missing in (("A", only_a), ("B", only_b)):
        for nodeid in missing[:20]:
            print(f"  only in {name}: {nodeid}")
    return 1 if lines or only_a or only_b else 0


if __name__ == "__main__":
    sys.exit(main())
