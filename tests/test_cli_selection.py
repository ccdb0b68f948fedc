"""te-verify run adds the cases folder only when the arguments for pytest select no cases themselves: given a node
id, a case file or pytest's @file of node ids it runs those, not their union with the whole tier (which is what
pytest makes of the folder and a node id together)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from te_verify.cli import names_cases

ROOT = Path(__file__).resolve().parents[1]
NODEID = "cases/test_freeze.py::test_freeze[eager-lin4-w32.32.32.32.32-freeze1010-bias-x_nograd-in8-fp32-r1]"


@pytest.mark.parametrize("extra, named", [
    ([], False), (["-k", "freeze and eager"], False), (["-x", "--te-capability", "sm100"], False),
    ([NODEID], True), (["cases/test_freeze.py"], True), (["@/tmp/ids.txt"], True),
])
def test_what_selects_cases_itself(extra, named):
    assert names_cases(extra) is named


def test_a_file_of_node_ids_runs_only_those(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text(NODEID + "\n")
    done = subprocess.run([sys.executable, "-m", "te_verify.cli", "run", "--tier", "smoke", "--workers", "0",
                           "--report-dir", str(tmp_path / "report"), f"@{ids}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "report" / "rows.jsonl").read_text().splitlines()]
    assert [r["nodeid"] for r in rows if r.get("kind") == "row"] == [NODEID]
