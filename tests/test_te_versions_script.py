"""scripts/te_versions.py's gaps.md: per version, how each known gap's cases ended, and the failures no known gap
covers (a gap whose version-guarded entry does not hold in a version shows there, not nowhere)."""
from __future__ import annotations

import json
from pathlib import Path
from loading import load_file

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "te_versions.py"
GAP = {"reason": "second backward raises", "link": "https://github.com/NVIDIA/TransformerEngine/issues/990"}


def _script():
    return load_file(SCRIPT, "te_versions")


def _results(tmp_path: Path, version: str, rows: list[dict]) -> Path:
    path = tmp_path / version / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"rows": [{"backend": "te_eager", "family": "te_replay", **r} for r in rows]}))
    return path


def test_gaps_table_counts_known_gaps_and_uncovered_failures_per_version(tmp_path):
    old = _results(tmp_path, "2.14.0", [{"outcome": "xfailed", "expectation": GAP}, {"outcome": "passed"}])
    new = _results(tmp_path, "2.15.0", [{"outcome": "failed"}, {"outcome": "xpassed", "expectation": GAP}])
    lines = _script().gaps_table({"2.14.0": old, "2.15.0": new}).splitlines()
    assert lines[0] == "| known gap | link | TE 2.14.0 | TE 2.15.0 |", lines
    assert "| te_eager: second backward raises | https://github.com/NVIDIA/TransformerEngine/issues/990 " \
           "| 1 xfailed | 1 xpassed |" in lines, lines
    assert "| te_eager: te_replay: failed, no known gap | - | - | 1 failed |" in lines, lines
    assert len(lines) == 4, lines  # the passed case is in no row
