"""Known gaps judged check by check (te_verify.expectations.judge): a gap blinds only its own checks.

Unit tests of `judge`, then the real plugin on planted backends: a recorded gap stays a known gap while only its
check fails, and a second fault beside it fails the case naming the second check.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_plugin import run_pytest

from te_verify.checks.verdict import Verdict
from te_verify.expectations.entries import Expectation, load_file
from te_verify.expectations.judge import GAP_PASSED, KNOWN_GAP, PASSED, FAILED, check_results, judge

LINK = "https://github.com/NVIDIA/TransformerEngine/pull/1770"


def _entry(checks: tuple[str, ...], failure: str | None = None, line: int = 3) -> Expectation:
    return Expectation(file="expectations/te_eager.toml", line=line, backend="te_eager", status="xfail",
                       prefix="lin4-", nodeid=None, reason="keeps its FP8 weight copy", link=LINK, failure=failure,
                       checks=checks)


def _results(**oks: bool | str) -> dict:
    """check name -> ok (True), or the failure message (a string)."""
    return check_results([Verdict(name, ok is True, "" if ok is True else f"[case] {ok}") for name, ok in oks.items()])


def test_exactly_the_gaps_checks_failing_is_the_known_gap():
    judgement = judge([_entry(("fp8_copies",), "saved weight FP8 copy")],
                      _results(grad_parity=True, fp8_copies="layer 1: saved weight FP8 copy, 0 required"))
    assert judgement.outcome == "xfailed" and LINK in judgement.message
    assert judgement.checks == {"grad_parity": PASSED, "fp8_copies": KNOWN_GAP}


def test_a_failure_beside_the_gap_fails_naming_its_check():
    judgement = judge([_entry(("fp8_copies",))],
                      _results(grad_parity="grad of 1.weight: max abs err 0.05", fp8_copies="saved weight FP8 copy"))
    assert judgement.outcome == "failed"
    assert "FAILED BESIDE A KNOWN GAP: check 'grad_parity' failed" in judgement.message
    assert "grad of 1.weight" in judgement.message and "te_eager.toml:3" in judgement.message
    assert judgement.checks == {"grad_parity": FAILED, "fp8_copies": KNOWN_GAP}


def test_a_covered_check_that_passes_is_an_unexpected_pass_naming_the_entry():
    judgement = judge([_entry(("fp8_copies", "te_saved_bytes"))],
                      _results(fp8_copies="saved weight FP8 copy", te_saved_bytes=True))
    assert judgement.outcome == "xpassed"
    assert "UNEXPECTED PASS: check(s) te_saved_bytes passed" in judgement.message and "te_eager.toml:3" in judgement.message
    assert judgement.checks["te_saved_bytes"] == GAP_PASSED


def test_the_gaps_check_failing_otherwise_fails_differently():
    judgement = judge([_entry(("fp8_copies",), "saved weight FP8 copy")], _results(fp8_copies="saved input FP8 copy"))
    assert judgement.outcome == "failed" and "FAILED DIFFERENTLY" in judgement.message


def test_a_gap_whose_check_was_left_unobserved_by_a_covered_raise_holds_without_its_text():
    """A run that raised where a gap is recorded leaves waste_peak not observed: the entry about waste_peak's usual
    failure holds (it is not asked for its text), while a waste_peak failing on its own must still carry it."""
    gaps = [_entry(("ending",), "donated buffers", line=3), _entry(("waste_peak",), "allocates outside", line=9)]
    blocked = check_results([Verdict("ending", False, "raised: donated buffers"),
                             Verdict("waste_peak", False, "waste_peak not observed: the run raised", blocked_by="ending")])
    assert judge(gaps, blocked).outcome == "xfailed"
    observed = check_results([Verdict("ending", False, "raised: donated buffers"),
                              Verdict("waste_peak", False, "peak 3x eager's")])
    assert "FAILED DIFFERENTLY" in judge(gaps, observed).message


def test_an_entry_naming_a_check_the_case_does_not_run_fails_naming_both():
    judgement = judge([_entry(("fp8_copys",))], _results(fp8_copies="saved weight FP8 copy"))
    assert judgement.outcome == "failed"
    assert "covers check 'fp8_copys', which this case does not run (its checks: fp8_copies)" in judgement.message


def test_two_gaps_of_one_case_each_cover_their_own_check():
    gaps = [_entry(("ending",), "raised AttributeError", line=3), _entry(("fp8_copies",), line=9)]
    both = judge(gaps, _results(ending="raised AttributeError at backward pass 2", fp8_copies="weight copy",
                                grad_parity=True))
    assert both.outcome == "xfailed" and len(both.held) == 2
    one = judge(gaps, _results(ending="raised AttributeError at backward pass 2", fp8_copies=True, grad_parity=True))
    assert one.outcome == "xpassed" and "te_eager.toml:9" in one.message


def test_a_gap_about_some_elements_blinds_only_them():
    """A tied weight's gap (TE 3437) covers grad_parity on 1.weight; a 5% error of 0.weight beside it is named."""
    tied = _entry(("grad_parity",), "max abs err")
    tied = Expectation(**{**tied.__dict__, "elements": ("1.weight",)})
    itemized = lambda *items: check_results([Verdict("grad_parity", False, "; ".join(items), problems=items)])
    gap = "grad of 1.weight: max abs err 3.51"
    assert judge([tied], itemized(gap)).outcome == "xfailed"
    beside = judge([tied], itemized(gap, "grad of 0.weight: max abs err 0.05", "grad of 11.weight: max abs err 1"))
    assert beside.outcome == "failed" and "check 'grad_parity' failed on elements its gap is not about" in beside.message
    assert "grad of 0.weight: max abs err 0.05" in beside.message and "grad of 11.weight" in beside.message
    assert gap not in beside.message.split("not about:")[1]


def test_no_entry_passes_iff_every_check_passed():
    assert judge([], _results(grad_parity=True, waste_flops=True)).outcome == "passed"
    failed = judge([], _results(grad_parity=True, waste_flops="layer 1 (frozen weight): 1 wgrad GEMM, 0 required"))
    assert failed.outcome == "failed" and failed.message == "[case] layer 1 (frozen weight): 1 wgrad GEMM, 0 required"


def test_verdicts_of_one_check_name_pass_only_together():
    results = check_results([Verdict("gemm_work", True), Verdict("gemm_work", False, "layer 2: 1 dgrad GEMM")])
    assert not results["gemm_work"].ok and results["gemm_work"].message == "layer 2: 1 dgrad GEMM"


# The real plugin on planted backends (tests/planted_gaps.py): a gradient kept on a frozen weight, recorded below as a
# gap of `grad_presence` and `waste_peak` (the gradient's bytes), and in the second backend also layer 1's weight gradient 1% off beside it.
GAP = f'''\
[[xfail]]
glob = "*"
family = "freeze"
checks = ["grad_presence", "waste_peak"]
reason = "planted: keeps a gradient for a frozen weight (its bytes raise the peak)"
link = "{LINK}"
'''


def _run(tmp_path: Path, backend: str) -> dict:
    expectations = tmp_path / "expectations"
    expectations.mkdir(exist_ok=True)
    (expectations / f"{backend.split(':')[1].lower()}.toml").write_text(GAP)
    report = tmp_path / f"report-{backend.split(':')[1]}"
    proc = run_pytest("cases/test_freeze.py", "--tier", "smoke", "--backend", backend, "--expectations",
                      str(expectations), "--report-dir", str(report), "-k", "freeze1010 or freeze0011")
    rows = json.loads((report / "results.json").read_text())["rows"]
    return {"code": proc.returncode, "out": proc.stdout, "rows": rows}


@pytest.mark.system
def test_plugin_keeps_a_gap_blind_only_to_its_own_checks(tmp_path):
    gap_only = _run(tmp_path, "planted_gaps:KeepsFrozenGrad")
    assert gap_only["code"] == 0, gap_only["out"][-3000:]
    assert gap_only["rows"] and {r["outcome"] for r in gap_only["rows"]} == {"xfailed"}
    assert len(gap_only["rows"]) == 2 and all(
        r["checks"]["grad_presence"] == KNOWN_GAP and r["checks"]["grad_parity"] == PASSED for r in gap_only["rows"])
    beside = _run(tmp_path, "planted_gaps:KeepsFrozenGradAndOffByOnePercent")
    assert beside["code"] == 1 and {r["outcome"] for r in beside["rows"]} == {"failed"}
    assert "FAILED BESIDE A KNOWN GAP: check 'grad_parity' failed" in beside["out"]
    assert all(r["checks"]["grad_parity"] == FAILED and r["checks"]["grad_presence"] == KNOWN_GAP
               for r in beside["rows"])


def test_xfail_entries_must_name_their_checks(tmp_path):
    path = tmp_path / "te_eager.toml"
    path.write_text(f'[[xfail]]\nprefix = "lin4"\nreason = "r"\nlink = "{LINK}"\n')
    try:
        load_file(path)
    except ValueError as exc:
        assert str(exc).startswith(f"{path}:1: ") and "missing 'checks'" in str(exc)
    else:
        raise AssertionError("an xfail entry without checks loaded")
