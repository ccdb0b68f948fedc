"""How `--shard K/N` splits the main job's work: per pass and per shard, the cases and the sum of their measured
seconds (a report's rows), so a split by case id can be checked against a split by cost.

    .venv/bin/python scripts/shard_balance.py REPORT/passes/sm90 REPORT/passes/sm100 ... [--shards 2] [--workers 2]

A pass's folder name is its name. The estimate of a shard's wall time is its case-seconds over the workers (what the
fixed start-up of each pass adds is measured apart: docs/performance.md).
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from te_verify.matrix.shard import shard_of


def shard_seconds(rows: list[dict], shards: int) -> tuple[Counter, Counter]:
    """(case-seconds, cases) per shard (1-based) of one pass's rows, each row in the shard of its case id."""
    seconds, cases = Counter(), Counter()
    for row in rows:
        shard = shard_of(row["case_id"], shards)
        seconds[shard] += row.get("duration") or 0.0
        cases[shard] += 1
    return seconds, cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("passes", type=Path, nargs="+", help="one report folder per pass")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    total = Counter()
    for folder in args.passes:
        seconds, cases = shard_seconds(json.loads((folder / "results.json").read_text())["rows"], args.shards)
        total.update(seconds)
        print(f"{folder.name}: " + "; ".join(f"shard {k}: {cases[k]} cases, {seconds[k]:.0f} case-s"
                                               for k in range(1, args.shards + 1)))
    print("all passes: " + "; ".join(f"shard {k}: {total[k]:.0f} case-s, about {total[k] / args.workers:.0f} s on "
                                     f"{args.workers} workers" for k in range(1, args.shards + 1)))


if __name__ == "__main__":
    main()
