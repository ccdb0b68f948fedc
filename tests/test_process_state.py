"""A case leaves the process as it found it (issue 25, point 3): te_verify.run.process_state's snapshot, comparison and
restore of each setting; the `process_state` check on planted backends (tests/planted_leaks.py), each leaving one
setting changed after its case: the culprit fails naming what it left, only that, and the next case in the process
has exactly the verdicts it has alone; a backend that changes settings inside its forward and puts them back passes;
the plugin restores what a test's body left outside the runner and fails it, beside a known gap too.
"""
from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch

from planted_leaks import (LeavesAutocastEntered, LeavesDefaultDtypeFloat64, LeavesDeterministicAlgorithms,
                           LeavesFP8AutocastEntered, LeavesGradModeOff, LeavesMatmulPrecisionHigh,
                           LeavesMatmulPrecisionMedium, LeavesOneThread)
from test_plugin import run_pytest
from te_verify.run import process_state
from te_verify.te import api as te_api
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.backends.torch_compile import TorchCompileBackend
from te_verify.run.caserun import CaseRun
from te_verify.checks.leftovers import process_state as process_state_check
from te_verify.checks.verdict import CheckFailures, Verdict
from te_verify.record import Record
from te_verify.te.reference.recipe import DelayedScaling
from te_verify.spec import CaseSpec, TEConfig
from te_verify.run.te_case import verify_te_stack

import te_verify.te.reference.autocast  # noqa: F401 -- loaded, so its FP8 state is in every snapshot

SPEC = CaseSpec("freeze", (32, 64, 32), (False, True), (False, True), True, (8,), "fp32", 1)
TE_SPEC = CaseSpec("te_peft", (32, 64, 32), (False, True), (False, True), True, (16,), te=TEConfig(recipe="delayed"))
REFERENCE_FP8 = sys.modules["te_verify.te.reference.autocast"]
THREADS = torch.get_num_threads()


def _enter(region) -> object:
    region.__enter__()
    return region  # kept alive until the comparison: an inference-mode guard that is destroyed restores the mode


def _replace_linear() -> None:
    torch.nn.functional.linear = lambda *args, **kwargs: None


def _bf16_mkldnn_matmul() -> None:
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"


def _reference_fp8_left_entered() -> None:
    """What the reference's autocast sets on entry (its generator, if left to the garbage collector, would leave the
    region after the restore)."""
    state = REFERENCE_FP8.STATE
    state.enabled, state.recipe, state.depth = True, DelayedScaling(), state.depth + 1


def _set_benchmark() -> None:
    torch.backends.cudnn.benchmark = True


# (what the block does, what restore must say it left) for every judged setting.
LEAKS = {
    "inference mode": (lambda: _enter(torch.inference_mode()), ["left inference mode enabled"]),
    "grad mode": (lambda: torch.set_grad_enabled(False), ["left grad mode disabled"]),
    "anomaly mode": (lambda: torch.set_anomaly_enabled(True), ["left anomaly mode: enabled True (was False)"]),
    "default dtype": (lambda: torch.set_default_dtype(torch.float64),
                      ["left the default dtype torch.float64 (was torch.float32)"]),
    "default device": (lambda: torch.set_default_device("meta"), ["left the default device meta (was cpu)"]),
    "deterministic algorithms": (lambda: torch.use_deterministic_algorithms(True, warn_only=True),
                                 ["left deterministic algorithms: enabled True (was False), warn_only True "
                                  "(was False)"]),
    "intra-op threads": (lambda: torch.set_num_threads(THREADS + 1),
                         [f"left the intra-op thread count {THREADS + 1} (was {THREADS})"]),
    "matmul precision": (lambda: torch.set_float32_matmul_precision("medium"),
                         ["left float32 precision: matmul precision 'medium' (was 'highest'), cuda matmul 'tf32' (was "
                          "'none'), mkldnn matmul 'bf16' (was 'none')"]),
    "per-backend precision": (_bf16_mkldnn_matmul, ["left float32 precision: mkldnn matmul 'bf16' (was 'none')"]),
    "autocast": (lambda: _enter(torch.autocast("cpu", dtype=torch.bfloat16)),
                 ["left autocast: nesting 1 (was 0), cpu enabled True (was False)"]),
    "backend flags": (_set_benchmark, ["left backend flags: cudnn.benchmark True (was False)"]),
    "torch.nn.functional": (_replace_linear, ["left torch.nn.functional.linear replaced by "
                                              "test_process_state._replace_linear.<locals>.<lambda>"]),
    "FP8 autocast state": (_reference_fp8_left_entered,
                           ["left FP8 autocast state: te_verify.te.reference autocast depth 1 (was 0), "
                            "te_verify.te.reference FP8 enabled True (was False), "
                            f"te_verify.te.reference recipe {DelayedScaling()} (was None)"]),
}


@pytest.mark.parametrize("setting", list(LEAKS))
def test_each_setting_is_named_and_put_back(setting):
    change, expected = LEAKS[setting]
    before = process_state.snapshot()
    with process_state.kept() as found:
        kept_alive = change()  # noqa: F841
    assert found.messages == expected
    assert found.compared == sum(s.judged for s in process_state.SETTINGS) == 15
    assert process_state.restore(before).messages == [], "restored"
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert torch.get_float32_matmul_precision() == "highest"  # readable again: no mix of legacy and per-backend left


def test_the_rng_is_put_back_and_never_a_fault():
    torch.manual_seed(3)
    first = torch.rand(4)
    torch.manual_seed(3)
    with process_state.kept() as found:
        torch.rand(7)  # what a run draws
    assert found.messages == [] and torch.equal(torch.rand(4), first)


def test_kept_puts_back_what_a_raising_block_left():
    with pytest.raises(ValueError), process_state.kept() as found:
        torch.set_grad_enabled(False)
        raise ValueError("the block's own failure")
    assert torch.is_grad_enabled() and found.messages == ["left grad mode disabled"]


def test_the_check_fails_naming_what_the_run_left_and_reports_the_reference():
    ref, got = Record("eager", process_left=[], process_compared=12), Record("b", process_left=[], process_compared=12)
    assert process_state_check("case", "b", ref, got) == Verdict("process_state", True, "",
                                                                 {"process_settings_compared": 12})
    got.process_left = ["left grad mode disabled", "left the default dtype torch.float64 (was torch.float32)"]
    failed = process_state_check("case", "b", ref, got)
    assert not failed.ok and failed.message == ("[case] backend b: left grad mode disabled; left the default dtype "
                                                "torch.float64 (was torch.float32)")
    ref.process_left, got.process_left = ["left grad mode disabled"], []  # the harness's fault, not the backend's
    reported = process_state_check("case", "b", ref, got)
    assert reported.ok and reported.figures["reference_process_left"] == ["left grad mode disabled"]
    unwatched = process_state_check("case", "b", ref, Record("b"))
    assert not unwatched.ok and "process state not observed" in unwatched.message


def _verdicts(case: CaseRun, verify=CaseRun.verify) -> list[Verdict]:
    try:
        return verify(case)
    except CheckFailures as exc:
        return exc.verdicts


def _judged(verdicts: list[Verdict]) -> list[tuple]:
    return [(v.check, v.ok, v.message, v.figures) for v in verdicts]


_ALONE: dict[str, list[tuple]] = {}


def _alone(backend) -> list[tuple]:
    """The backend's verdicts on SPEC, run before any culprit (once per backend)."""
    if backend.name not in _ALONE:
        _ALONE[backend.name] = _judged(_verdicts(CaseRun(SPEC, backend.name, backend)))
    return _ALONE[backend.name]


def _judged_state() -> dict:
    return {s.name: s.read() for s in process_state.SETTINGS if s.judged}


@pytest.mark.parametrize("culprit, left", [
    (LeavesGradModeOff, "left grad mode disabled"),
    (LeavesDefaultDtypeFloat64, "left the default dtype torch.float64 (was torch.float32)"),
    (LeavesDeterministicAlgorithms, "left deterministic algorithms: enabled True (was False)"),
    (LeavesOneThread, f"left the intra-op thread count {THREADS + 1} (was {THREADS})"),
    (LeavesMatmulPrecisionMedium, "left float32 precision: matmul precision 'medium' (was 'highest')"),
    (LeavesMatmulPrecisionHigh, "left float32 precision: matmul precision 'high' (was 'highest')"),
    (LeavesAutocastEntered, "left autocast: nesting 1 (was 0), cpu enabled True (was False)"),
], ids=lambda p: p.__name__ if isinstance(p, type) else "")
def test_the_culprit_fails_naming_what_it_left_and_the_next_case_is_judged_alone(culprit, left):
    after = [EagerBackend(), TorchCompileBackend()] if culprit is LeavesGradModeOff else [EagerBackend()]
    alone = [_alone(backend) for backend in after]
    state = _judged_state()
    failed = {v.check: v.message for v in _verdicts(CaseRun(SPEC, culprit.name, culprit())) if not v.ok}
    assert set(failed) == {"process_state"}, failed  # its values are eager's: the truth run after it ran as alone
    assert failed["process_state"].startswith(f"[{SPEC.id}] backend {culprit.name}: {left}")
    assert _judged_state() == state
    for backend, verdicts in zip(after, alone):
        assert _judged(_verdicts(CaseRun(SPEC, backend.name, backend))) == verdicts, f"{backend.name} after {culprit}"


class ChangesSettingsInside:
    """Correct: one intra-op thread, deterministic algorithms and an fp64 default dtype inside its forward, each put
    back before it returns (the clean twin of the leaks)."""

    name = "changes_settings_inside"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model, spec):
        def forward(x):
            threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
            torch.set_num_threads(1)
            torch.use_deterministic_algorithms(True)
            torch.set_default_dtype(torch.float64)
            try:
                return model(x)
            finally:
                torch.set_num_threads(threads)
                torch.use_deterministic_algorithms(False)
                torch.set_default_dtype(dtype)
        return forward


def test_settings_changed_and_put_back_inside_the_forward_pass():
    backend = ChangesSettingsInside()
    verdicts = CaseRun(SPEC, backend.name, backend).verify()
    assert next(v for v in verdicts if v.check == "process_state").figures == {"process_settings_compared": 15}


@pytest.mark.skipif(not te_api.te_installed(), reason="transformer_engine is not installed")
def test_te_graph_capture_left_started_is_named_and_put_back(te_python):
    """What a TE capture that raised leaves (make_graphed_callables over the emulation meets the refused
    torch.cuda.CUDAGraph after graph.set_capture_start): named, and cleared for the next case."""
    te_python.api  # noqa: B018 (TE's Python loaded)
    graph = importlib.import_module(process_state.TE_GRAPH_MODULE)
    with process_state.kept() as found:
        graph.set_capture_start()
    assert found.messages == ["left TE's graph capture enabled"]
    assert not graph.is_graph_capturing(), "the flag was not cleared"


@pytest.mark.skipif(not te_api.te_installed(), reason="transformer_engine is not installed")
def test_te_fp8_autocast_left_entered_fails_in_the_te_lane():
    """te_eager's FP8 cases keep a known gap (fp8_copies, te_saved_bytes: the FP8 weight copy): the culprit fails
    those and process_state; te_eager after it has its verdicts alone."""
    with te_api.using(te_api.resolve(te_api.CPU_CHOICE)):
        alone = _judged(_verdicts(CaseRun(TE_SPEC, "te_eager", TEEagerBackend()), verify_te_stack))
        state = _judged_state()
        culprit = _verdicts(CaseRun(TE_SPEC, "te_eager", LeavesFP8AutocastEntered()), verify_te_stack)
        failed = {v.check: v.message for v in culprit if not v.ok}
        assert set(failed) == {check for check, ok, _, _ in alone if not ok} | {"process_state"}, failed
        assert failed["process_state"].startswith(f"[{TE_SPEC.id}] backend te_eager: left FP8 autocast state: TE "
                                                  "autocast depth 1 (was 0)")
        assert _judged_state() == state
        assert _judged(_verdicts(CaseRun(TE_SPEC, "te_eager", TEEagerBackend()), verify_te_stack)) == alone


# A case family whose test body leaves grad mode disabled after its checks passed (outside the runner), and a plain
# test after it that needs grad mode; run by the real plugin with a known gap recorded for planted_gaps' backend.
LEAKING_CASES = '''\
import torch
from te_verify.spec import CaseSpec

FAMILY = "freeze"
LANE = "torch"


def SPECS(tier):
    return [CaseSpec("freeze", (32, 64, 32), (True, False), (True, False), True, (8,), "fp32", 1)]


def test_leaks(case):
    try:
        case.verify()
    finally:
        torch.set_grad_enabled(False)


def test_after():
    assert torch.is_grad_enabled()
'''
GAP = '''\
[[xfail]]
glob = "*"
family = "freeze"
checks = ["grad_presence", "waste_peak"]
reason = "planted: keeps a gradient for a frozen weight"
link = "https://github.com/NVIDIA/TransformerEngine/pull/1770"
'''


@pytest.mark.system
def test_the_plugin_puts_back_what_a_test_body_left_and_fails_it(tmp_path):
    (tmp_path / "test_leaking.py").write_text(LEAKING_CASES)
    (tmp_path / "expectations").mkdir()
    (tmp_path / "expectations" / "keepsfrozengrad.toml").write_text(GAP)
    proc = run_pytest(str(tmp_path / "test_leaking.py"), "--backend", "eager", "--backend",
                      "planted_gaps:KeepsFrozenGrad", "--expectations", str(tmp_path / "expectations"),
                      "--report-dir", str(tmp_path / "report"))
    rows = {r["backend"]: r for r in json.loads((tmp_path / "report" / "results.json").read_text())["rows"]}
    assert proc.returncode == 1, proc.stdout[-3000:]
    case_id = "lin2-w32.64.32-freeze10-bias-x_grad-in8-fp32-r1"
    eager, gap, after = rows["eager"], rows["keepsfrozengrad"], rows["-"]
    assert eager["outcome"] == "failed" and eager["checks"]["process_state"] == "failed"
    assert f"[{case_id}] backend eager: the test left grad mode disabled" in eager["reason"]
    assert {c for c, result in eager["checks"].items() if result != "passed"} == {"process_state"}
    assert gap["outcome"] == "failed" and gap["checks"]["grad_presence"] == "known gap"
    assert gap["reason"].startswith("FAILED BESIDE A KNOWN GAP: check 'process_state' failed")
    assert after["outcome"] == "passed", "the plugin put grad mode back after each leaking test"
