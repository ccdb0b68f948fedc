"""`te-verify report diff`: planted regressions between two results files are reported with a non-zero exit."""
from __future__ import annotations

import copy
import json

from report_fixtures import FREEZE, FREEZE_X, PEFT_TE, REPLAY, regressed, results, row, write

from te_verify.report.diff import Thresholds, diff_results, main


def _nodeids(items: list[dict]) -> list[str]:
    return [item["nodeid"] for item in items]


def _row_of(payload: dict, case_id: str, backend: str) -> dict:
    return next(r for r in payload["rows"] if (r["case_id"], r["backend"]) == (case_id, backend))


def test_planted_failure_and_ratio_rise_are_reported():
    old = results()
    new = regressed(old)
    diff = diff_results(old, new)
    failed = _row_of(new, FREEZE.id, "thunder")
    assert _nodeids(diff["new_failures"]) == [failed["nodeid"]]
    assert diff["new_failures"][0]["old_outcome"] == "passed"
    assert "1.weight: gradient is None" in diff["new_failures"][0]["reason"]
    [reg] = diff["regressions"]
    assert (reg["nodeid"], reg["figure"], reg["old"], reg["new"]) == (_row_of(new, FREEZE_X.id, "thunder")["nodeid"],
                                                                      "flops_ratio", 1.0, 1.3)
    assert diff["regressed"]


def test_cli_exits_nonzero_and_writes_diff_next_to_new(tmp_path, capsys):
    old = write(tmp_path / "night1" / "results.json", results())
    new = write(tmp_path / "night2" / "results.json", regressed(results()))
    assert main([str(old), str(new)]) == 1
    printed = capsys.readouterr().out
    assert "REGRESSED" in printed and "flops_ratio 1 -> 1.3" in printed
    diff = json.loads((tmp_path / "night2" / "diff.json").read_text())
    assert len(diff["new_failures"]) == 1 and len(diff["regressions"]) == 1
    assert "## New failures" in (tmp_path / "night2" / "diff.md").read_text()
    page = (tmp_path / "night2" / "report.html").read_text()
    assert page.index('id="diff"') < page.index('id="matrix-torch"')  # the diff is at the top of the page


def test_identical_runs_exit_zero(tmp_path, capsys):
    old = write(tmp_path / "a" / "results.json", results())
    new = write(tmp_path / "b" / "results.json", results("20260102-020000"))
    assert main([str(old), str(new), "--no-html"]) == 0
    assert "no regressions" in capsys.readouterr().out
    assert not (tmp_path / "b" / "report.html").exists()


def test_fixed_new_and_removed_cases_do_not_fail_the_diff():
    old = regressed(results())
    new = copy.deepcopy(results())
    new["rows"] = [r for r in new["rows"] if r["case_id"] != REPLAY.id]
    new["rows"].append(row(FREEZE.replace(seed=3), "thunder", "passed"))
    diff = diff_results(old, new)
    assert _nodeids(diff["fixed"]) == [_row_of(new, FREEZE.id, "thunder")["nodeid"]]
    assert [r["case_id"] for r in diff["new_cases"]] == [FREEZE.replace(seed=3).id]
    assert [r["case_id"] for r in diff["removed_cases"]] == [REPLAY.id]
    assert not diff["regressed"]


def test_a_new_case_that_fails_is_a_new_failure():
    old = results()
    new = copy.deepcopy(old)
    new["rows"].append(row(PEFT_TE.replace(seed=1), "thunder_te", "failed", reason="boom"))
    diff = diff_results(old, new)
    assert [(r["case_id"], r["old_outcome"]) for r in diff["new_failures"]] == [(PEFT_TE.replace(seed=1).id, None)]


def _with_figures(old_figs: dict, new_figs: dict, old_duration=0.5, new_duration=0.5) -> list[tuple[str, float]]:
    old = {"schema_version": 1, "header": {}, "rows": [row(FREEZE, "thunder", "passed", old_figs, duration=old_duration)]}
    new = {"schema_version": 1, "header": {}, "rows": [row(FREEZE, "thunder", "passed", new_figs, duration=new_duration)]}
    return [(r["figure"], r["new"]) for r in diff_results(old, new, Thresholds())["regressions"]]


def test_thresholds_separate_noise_from_regressions():
    assert _with_figures({"flops_ratio": 1.0}, {"flops_ratio": 1.04}) == []
    assert _with_figures({"saved_bytes_ratio": 1.0}, {"saved_bytes_ratio": 1.06}) == [("saved_bytes_ratio", 1.06)]
    assert _with_figures({"peak_bytes": 1000}, {"peak_bytes": 1050}) == []
    assert _with_figures({"saved_bytes_actual": 1000}, {"saved_bytes_actual": 1200}) == [("saved_bytes_actual", 1200)]
    assert _with_figures({}, {}, old_duration=0.5, new_duration=1.2) == []  # +140% but only +0.7 s
    assert _with_figures({}, {}, old_duration=2.0, new_duration=4.0) == [("duration", 4.0)]
    assert _with_figures({"compilations": 1}, {"compilations": 5}) == []  # not a watched figure


def test_unreadable_input_is_a_one_line_error(tmp_path, capsys):
    bogus = tmp_path / "results.json"
    bogus.write_text('{"rows": []}')
    assert main([str(bogus), str(bogus)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bogus) in err and "schema_version" in err


def test_a_version_change_between_two_nights_is_named(tmp_path, capsys):
    old, new = results(), results("20260102-020000")
    old["header"]["versions"]["deepspeed"] = "0.19.8"
    new["header"]["versions"].update(deepspeed="0.19.9", peft="0.21.2")
    diff = diff_results(old, new)
    assert diff["versions_changed"] == [{"package": "deepspeed", "old": "0.19.8", "new": "0.19.9"},
                                        {"package": "peft", "old": "absent", "new": "0.21.2"}]
    assert not diff["regressed"]  # a new version is news, not a regression
    code = main([str(write(tmp_path / "a" / "results.json", old)), str(write(tmp_path / "b" / "results.json", new))])
    assert code == 0 and "deepspeed 0.19.8 -> 0.19.9" in capsys.readouterr().out
    assert "deepspeed 0.19.8 -> 0.19.9" in (tmp_path / "b" / "diff.md").read_text()
    assert json.loads((tmp_path / "b" / "diff.json").read_text())["versions_changed"][0]["new"] == "0.19.9"
    assert 'id="versions-changed"' in (tmp_path / "b" / "report.html").read_text()
