"""What streaming rows to rows.jsonl costs a run: every row of a finished run's results.json written again through
te_verify.report.stream.RowStream (one JSON line each, flushed, as the controller writes them), timed, and set
against that run's wall time.

    .venv/bin/python scripts/bench_stream.py reports/<run>      # a pr-tier run's report folder
"""
from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path

from te_verify.report.stream import RowStream


def stream_seconds(rows: list[dict], repeats: int) -> float:
    """Best of `repeats`: seconds to write every row through a fresh RowStream."""
    best = float("inf")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            stream = RowStream(Path(folder))
            for row in rows:
                stream.write("row", row)
            stream.close()
            best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="a finished run's report folder")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = json.loads((args.report / "results.json").read_text())
    header, rows = results["header"], results["rows"]
    wall = (datetime.datetime.fromisoformat(header["finished"]) - datetime.datetime.fromisoformat(header["started"]))
    seconds = stream_seconds(rows, args.repeats)
    print(f"{len(rows)} rows streamed in {seconds * 1000:.1f} ms ({seconds / len(rows) * 1e6:.0f} us a row); "
          f"the run took {wall.total_seconds():.1f} s: {seconds / wall.total_seconds():.3%} of its wall time")


if __name__ == "__main__":
    main()
