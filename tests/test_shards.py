"""--shard K/N partitions a tier by case id; `te-verify report merge` puts the shards' reports back together,
refusing a case present twice and anything that is not a report, in one line naming the culprit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
from pytest_many import run_many

from te_verify.matrix.shard import ShardError, parse_shard, shard_of
from loading import load_file

ROOT = Path(__file__).resolve().parents[1]
SHARDS = (1, 2, 3)
# Cheap cases with two outcomes (compare_options skips on eager) for the merge round trip.
SELECTION = ["cases/test_freeze.py", "cases/test_bias.py", "cases/test_compare_options.py", "--tier", "pr",
             "--backend", "eager"]


def pytest_runs(invocations: dict) -> tuple[dict, str]:
    """Each invocation's node ids, and their output, every one run in a single interpreter (tests/pytest_many.py);
    all must pass."""
    results, proc = run_many(list(invocations.values()), env=dict(os.environ))
    assert [r["code"] for r in results] == [0] * len(invocations), proc.stdout[-3000:] + proc.stderr[-3000:]
    return {key: r["ids"] for key, r in zip(invocations, results)}, proc.stdout


def shard_args(k: int | None) -> list[str]:
    return [] if k is None else ["--shard", f"{k}/{len(SHARDS)}"]


@pytest.mark.system
def test_shards_of_the_pr_tier_partition_its_cases():
    ids, _ = pytest_runs({k: ["cases", "--tier", "pr", "--collect-only", *shard_args(k)] for k in (None, *SHARDS)})
    everything = set(ids[None])
    assert len(everything) == len(ids[None]) > 400  # the whole (chosen) pr tier, no duplicate ids
    parts = [set(ids[k]) for k in SHARDS]
    assert set().union(*parts) == everything
    assert sum(len(p) for p in parts) == len(everything)  # no overlap
    assert all(len(p) > len(everything) / 6 for p in parts), [len(p) for p in parts]


def test_shard_of_a_case_id_is_fixed():
    """sha256 of the id, not Python's per-process salted hash(): the same shard on every machine and run."""
    assert [shard_of(f"lin4-w32.32.32.32.32-freeze{m}-bias-x_nograd-in8-fp32-r1", 3) for m in ("0000", "0001")] == [1, 2]
    assert shard_of("lin4-w32.32.32.32.32-freeze0000-bias-x_grad-in8-fp32-r1", 3) == 3


@pytest.mark.parametrize("text", ["4/3", "0/3", "1/0", "x", "1-3"])
def test_bad_shard_is_a_one_line_error_naming_it(text):
    with pytest.raises(ShardError, match=f"--shard {text!r}") as info:
        parse_shard(text)
    assert "\n" not in str(info.value)


def merge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "te_verify.cli", "report", "merge", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


STALE = "lin9-no-such-case"  # an expectation entry no case matches


@pytest.fixture(scope="module")
def shard_runs(tmp_path_factory) -> tuple[dict, str]:
    """The selection run whole (key None) and as shards 1..3, each with results.json and junit.xml; their output."""
    base = tmp_path_factory.mktemp("shards")
    (base / "expectations").mkdir()
    (base / "expectations" / "eager.toml").write_text(
        f'[[xfail]]\nprefix = "{STALE}"\nchecks = ["grad_parity"]\nreason = "planted"\n'
        'link = "https://example.org/planted"\n')
    dirs = {k: base / f"shard{k or 0}" for k in (None, *SHARDS)}
    _, output = pytest_runs({k: [*SELECTION, *shard_args(k), "--report-dir", str(d), "--junitxml", str(d / "junit.xml"),
                                 "--expectations", str(base / "expectations")] for k, d in dirs.items()})
    return dirs, output


@pytest.fixture(scope="module")
def reports(shard_runs) -> dict:
    return shard_runs[0]


@pytest.mark.system
def test_a_shard_does_not_call_the_other_shards_expectations_stale(shard_runs):
    output = shard_runs[1]
    # the unsharded pr run judges none either (entries are judged on a nightly run: test_plugin), saying why
    assert "te_verify WARNING: stale expectation" not in output and STALE not in output
    assert output.count("stale expectations are judged on a nightly run (this run: the pr tier") == 1
    assert all(f"shard {k}/3: stale expectations are not judged on a shard" in output for k in SHARDS)


def outcomes(folder: Path) -> dict[str, str]:
    return {r["nodeid"]: r["outcome"] for r in json.loads((folder / "results.json").read_text())["rows"]}


@pytest.mark.system
def test_merge_of_the_shards_equals_the_unsharded_run(reports, tmp_path):
    merged = tmp_path / "merged"
    proc = merge(*(str(reports[k]) for k in SHARDS), "--out", str(merged))
    assert proc.returncode == 0, proc.stderr
    assert outcomes(merged) == outcomes(reports[None]) and set(Counter(outcomes(merged).values())) == {"passed", "skipped"}
    header = json.loads((merged / "results.json").read_text())["header"]
    assert header["shards"] == ["1/3", "2/3", "3/3"] and header["shard"] is None and header["tier"] == "pr"
    cases = ET.parse(merged / "junit.xml").getroot().iter("testcase")
    assert len(list(cases)) == len(outcomes(reports[None]))
    assert "Merged from shards 1/3, 2/3, 3/3" in (merged / "summary.md").read_text()
    assert "merged from shards" in (merged / "report.html").read_text()


@pytest.mark.system
def test_merge_refuses_a_case_present_twice_naming_it(reports, tmp_path):
    proc = merge(str(reports[1]), str(reports[None]), "--out", str(tmp_path / "m"))
    duplicate = next(nodeid for nodeid in outcomes(reports[None]) if nodeid in outcomes(reports[1]))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert f"case {duplicate} is in both {reports[1]} and {reports[None]}" in proc.stderr
    proc = merge(str(reports[1]), str(reports[1]), "--out", str(tmp_path / "m"))
    assert proc.returncode == 2 and "shard 1/3 is in both" in proc.stderr


@pytest.mark.system
def test_merge_names_a_missing_shard_and_still_writes(reports, tmp_path):
    proc = merge(str(reports[1]), str(reports[3]), "--out", str(tmp_path / "m"))
    assert proc.returncode == 1 and "shard(s) 2/3 missing" in proc.stderr
    assert len(outcomes(tmp_path / "m")) == len(outcomes(reports[1])) + len(outcomes(reports[3]))


@pytest.mark.system
def test_merging_a_non_report_is_a_one_line_error_naming_it(reports, tmp_path):
    stray = tmp_path / "notes.json"
    stray.write_text(json.dumps({"hello": 1}))
    for culprit in (stray, tmp_path / "missing"):
        proc = merge(str(reports[1]), str(culprit), "--out", str(tmp_path / "m"))
        assert proc.returncode == 2 and str(culprit) in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_shard_balance_sums_each_shards_case_seconds_by_case_id():
    """scripts/shard_balance.py: a row counts in the shard of its case id (the plugin's split), so the sums say how
    much work each shard of the main job holds."""
    path = ROOT / "scripts" / "shard_balance.py"
    module = load_file(path, "shard_balance")
    rows = [{"case_id": f"case{k}", "duration": float(k)} for k in range(10)]
    seconds, cases = module.shard_seconds(rows, 2)
    assert sum(cases.values()) == 10 and sum(seconds.values()) == 45.0
    assert seconds[1] == sum(float(k) for k in range(10) if shard_of(f"case{k}", 2) == 1)
