"""torch_compile_te: every row says whether TE's compiled path ran, read from the compiler; a fallback is never a pass
of that path; the header names the torch TE's path needs.

On torch < 2.14 (the pinned stack) TE disables its compiled path: rows say "fallback" with TE's words and the check is
not applicable. Tests of the compiled path itself need torch >= 2.14: they skip here and run in .venv-compile
(test_compiled_path_tests_in_the_compile_environment), where a compiled TE Linear planted to compute wgrad for a
frozen weight fails gemm_work naming the layer, its clean twin passes, a fallback planted where TE's code compiles
fails te_compile_path, and delayed scaling is reported as the fallback TE's code gives it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from te_verify.te import compile_path
from te_verify.backends.torch_compile_te import CompileLog, TorchCompileTEBackend, short_break
from te_verify.run.caserun import CaseRun
from te_verify.checks.te_compile import te_compile_verdicts
from te_verify.checks.verdict import CheckFailures
from te_verify.matrix.te import SQUARE4
from te_verify.record import Record
from te_verify.spec import CUSTOM_FACTORIES, RECIPES, CaseSpec, TEConfig
from planted_te_compile import PLANTED_REASON, compiled_wgrad_for_frozen, falls_back_where_te_compiles
from loading import load_file

ROOT = Path(__file__).resolve().parents[1]
COMPILE_PYTHON = ROOT / ".venv-compile" / "bin" / "python"
HAS_API = not compile_path.torch_missing_api()
needs_te_compile_path = pytest.mark.skipif(not HAS_API,
                                           reason=f"needs {compile_path.TORCH_NEEDED}: runs in .venv-compile")
FROZEN_1010 = (True, False, True, False)
# High precision, layers 0 and 2 frozen (weight and bias), input needing no grad: layer 2's backward runs (layer 1
# trains), its wgrad must not; layer 0 has no backward at all.
HP = CaseSpec("te_peft", SQUARE4, FROZEN_1010, FROZEN_1010, False, (16,), te=TEConfig())
DELAYED = HP.replace(te=TEConfig(recipe="delayed"))


def _peft_case():
    return load_file(ROOT / "cases" / "test_te_peft.py", "te_compile_peft").test_te_peft


def run_case(spec: CaseSpec) -> CaseRun:
    """The te_peft case function on torch_compile_te; its verdicts and row figures, passed or not."""
    case = CaseRun(spec, "torch_compile_te", TorchCompileTEBackend())
    try:
        _peft_case()(case)
    except CheckFailures:
        pass
    return case


def verdict(case: CaseRun, check: str):
    return next((v for v in case.verdicts if v.check == check), None)


# ---------------------------------------------------------------------------------------------- the check's logic
def _log(compiled: bool, breaks: dict | None = None) -> CompileLog:
    log = CompileLog({f"layers.{i}": (str(i), True) for i in range(2)})
    log.graphs, log.calls = 1, 2
    log.first_microbatch = {None}
    if compiled:
        log.ops.update({"0": 1, "1": 1})
    log.breaks.update(breaks or {})
    return log


def _verdicts(log: CompileLog, spec: CaseSpec = HP) -> tuple[list, CaseRun]:
    case = CaseRun(spec, "torch_compile_te", None)
    record = Record(backend="torch_compile_te")
    record.observations["te_compile"] = log
    return te_compile_verdicts(case, record), case


def test_a_fallback_where_te_compiles_fails_naming_layers_and_reason(monkeypatch):
    monkeypatch.setattr(compile_path, "environment_reason", lambda: None)
    (v,), _ = _verdicts(_log(False, {f"te.Linear falling back to eager: {PLANTED_REASON}": 1}))
    assert not v.ok and v.check == "te_compile_path"
    assert "layers ['0', '1'] fell back" in v.message and PLANTED_REASON in v.message and "1 graph break" in v.message
    assert v.figures["te_compile_path"] == "fallback" and v.figures["te_compile_expected"] == "compiled"


def test_a_compiled_run_where_te_compiles_passes_with_its_figures(monkeypatch):
    monkeypatch.setattr(compile_path, "environment_reason", lambda: None)
    (v,), _ = _verdicts(_log(True))
    assert v.ok and v.figures["te_compile_path"] == "compiled" and v.figures["graph_breaks"] == 0
    assert v.figures["te_compile_layers"] == {"compiled": ["0", "1"], "fallback": []}


def test_a_fallback_te_code_gives_is_no_verdict_and_the_row_says_so(monkeypatch):
    monkeypatch.setattr(compile_path, "environment_reason", lambda: None)
    verdicts, case = _verdicts(_log(False, {f"te.Linear falling back to eager: {compile_path.NOT_OPAQUE}": 2}), DELAYED)
    assert verdicts == []  # never a pass of the compiled path
    assert case.figures["te_compile_path"] == "fallback"
    assert compile_path.NOT_OPAQUE in case.figures["te_compile_reason"]
    assert case.figures["te_compile_check"].startswith(
        "not applicable: TE's code falls back here: " + compile_path.NOT_OPAQUE)


def test_te_op_in_a_case_te_leaves_to_eager_fails_as_a_stale_table(monkeypatch):
    monkeypatch.setattr(compile_path, "environment_reason", lambda: None)
    (v,), _ = _verdicts(_log(True), DELAYED)
    assert not v.ok and "TE's op ran for layers ['0', '1'] where TE's code falls back" in v.message


def test_nothing_compiled_is_not_observed():
    log = _log(False)
    log.graphs = 0
    (v,), _ = _verdicts(log)
    assert not v.ok and "te_compile_path not observed: nothing compiled in 2 call(s)" in v.message


def test_the_table_gives_te_s_reasons_per_configuration(monkeypatch):
    monkeypatch.setattr(compile_path, "environment_reason", lambda: None)
    fallback = lambda te, first=False: compile_path.expected_fallback(HP.replace(te=te), first)  # noqa: E731
    assert fallback(TEConfig()) == [] and fallback(TEConfig(recipe="current")) == []
    assert fallback(TEConfig(recipe="delayed")) == [compile_path.NOT_OPAQUE]
    assert fallback(TEConfig(recipe="current"), True) == [compile_path.WEIGHT_CACHING]
    assert fallback(TEConfig(module="linear", delay_wgrad=True)) == [compile_path.DELAYED_WGRAD]
    assert fallback(TEConfig(module="linear", main_grad=True)) == [compile_path.MAIN_GRAD]
    assert fallback(TEConfig(module="grouped_linear")) == [
        "TE ships no compiled path for GroupedLinear (only te.Linear has one)"]


def test_graph_break_records_read_in_te_s_words():
    assert short_break("Call to `torch._dynamo.graph_break()`\n  Explanation: User-inserted graph break. Message: "
                       "te.Linear falling back to eager: FP8 weight caching (is_first_microbatch)\n  Hint: x") == (
        "te.Linear falling back to eager: FP8 weight caching (is_first_microbatch)")
    assert short_break("Skip calling `torch.compiler.disable()`d function\n  Explanation: Skip calling function "
                       "`<function _linear_eager at 0x7f>` since") == "_linear_eager is torch.compiler.disable()d"
    assert short_break("Skip inlining `torch.compiler.disable()`d function\n  Explanation: Skip inlining function "
                       "<function Linear._forward_eager_fallback at 0x7f> since it was wrapped") == (
        "Linear._forward_eager_fallback is torch.compiler.disable()d")


# ---------------------------------------------------------------------------------------------- runs of TE
@pytest.mark.skipif(HAS_API, reason="this torch has TE's compile API: see the compiled-path tests")
@pytest.mark.system
def test_on_old_torch_every_row_falls_back_in_te_s_words_and_the_header_names_the_torch(tmp_path):
    """A case through the plugin (high precision, BitFit: its own known gap, TE's missing bias gradient, is beside
    the point): the row says fallback with TE's words, the check is not applicable (no te_compile_path verdict
    passes), the header and summary name the torch TE's path needs."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "cases/test_te_peft.py", "-p", "no:cacheprovider",
                           "--backend", "torch_compile_te", "--pr-candidates", "-W", "ignore",
                           "-k", "w32.64.128.64.32-freeze1111-bias0000-x_nograd-in16-fp32-r1-hp",
                           "--report-dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert "te_verify TE torch.compile: TE's torch.compile path needs torch >= 2.14" in proc.stdout, proc.stdout[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert f"this run's torch {torch.__version__} lacks" in results["header"]["te_compile"]
    (row,) = [r for r in results["rows"] if r["nodeid"].endswith("-hp]")]  # the -k also matches its recompute twin
    figures = row["figures"]
    assert figures["te_compile_path"] == "fallback" and "OpaqueValueBundle" in figures["te_compile_reason"]
    assert figures["te_compile_check"].startswith("not applicable: TE's code falls back here: environment: torch 2.1")
    assert figures["graph_breaks"] >= 1 and figures["te_compile_layers"]["compiled"] == []
    assert "te_compile_path" not in row.get("checks", {})
    assert "TE's compile path in torch_compile_te rows: 1 fallback" in (tmp_path / "summary.md").read_text()


@needs_te_compile_path
def test_clean_compiled_te_linear_passes(te_python):
    case = run_case(HP)
    assert [v.message for v in case.verdicts if not v.ok] == []
    assert verdict(case, "te_compile_path").ok and verdict(case, "gemm_work").ok
    assert case.figures["te_compile_path"] == "compiled" and case.figures["graph_breaks"] == 0
    assert case.figures["te_compile_layers"]["compiled"] == ["0", "1", "2", "3"]


@needs_te_compile_path
def test_compiled_te_linear_computing_wgrad_for_a_frozen_weight_fails_naming_the_layer(te_python):
    with compiled_wgrad_for_frozen():
        case = run_case(HP)
    gemm = verdict(case, "gemm_work")
    assert not gemm.ok and "layer 2 (frozen weight): 1 wgrad GEMM, 0 required" in gemm.message
    assert "layer 0" not in gemm.message  # no backward reaches layer 0
    assert verdict(case, "te_compile_path").ok  # the waste is in the compiled path itself


@needs_te_compile_path
def test_fallback_where_te_compiles_fails_te_compile_path(te_python):
    with falls_back_where_te_compiles():
        case = run_case(HP)
    v = verdict(case, "te_compile_path")
    assert not v.ok and PLANTED_REASON in v.message and "layers ['0', '1', '2', '3'] fell back" in v.message


@needs_te_compile_path
def test_delayed_scaling_is_reported_as_te_s_fallback(te_python):
    case = run_case(DELAYED)
    assert verdict(case, "te_compile_path") is None
    assert case.figures["te_compile_path"] == "fallback" and case.figures["graph_breaks"] >= 1
    assert compile_path.NOT_OPAQUE in case.figures["te_compile_reason"]
    assert case.figures["te_compile_check"] == f"not applicable: TE's code falls back here: {compile_path.NOT_OPAQUE}"


@pytest.mark.skipif(HAS_API, reason="this torch runs the compiled-path tests in place")
@pytest.mark.skipif(not COMPILE_PYTHON.exists(), reason="no .venv-compile: bash scripts/bootstrap.sh --compile")
@pytest.mark.system
def test_compiled_path_tests_in_the_compile_environment():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.run([str(COMPILE_PYTHON), "-m", "pytest", "tests/test_te_compile.py", "-p", "no:cacheprovider", "-q",
                           "-W", "ignore", "-k", "not compile_environment"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    # Everything but the old-torch test ran there and passed.
    assert proc.returncode == 0 and "1 skipped" in summary, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_each_recipe_is_judged_by_the_te_recipe_class_it_builds(monkeypatch):
    """TE registers the quantizers of current scaling, MXFP8, FP8 block scaling and NVFP4 as value-opaque: every
    spec recipe building one of those classes compiles (nvfp4_rn, NVFP4 without stochastic rounding, once read as
    a fallback: its compiled rows failed te_compile_path as a stale table in the torch 2.14 environment at sm100)."""
    monkeypatch.setattr(compile_path, "environment_reason", lambda: None)
    te = {recipe: TEConfig(recipe=recipe, qfactory=CUSTOM_FACTORIES[0] if recipe == "custom" else "")
          for recipe in RECIPES if recipe is not None}
    falls_back = {recipe for recipe, config in te.items()
                  if compile_path.expected_fallback(HP.replace(te=config), False)}
    assert falls_back == {"delayed", "custom"}


def test_torch_autocast_cases_are_unsupported_naming_the_attribution_limit():
    # te_verify cannot attribute GEMMs over autocast's weight copies made inside the compiled graph (gemm_work).
    backend = TorchCompileTEBackend()
    autocast = CaseSpec("te_autocast", SQUARE4, FROZEN_1010, FROZEN_1010, False, (16,), te=TEConfig(), autocast="bf16")
    assert "torch.autocast's bf16 weight copies" in backend.unsupported_reason(autocast)
    assert backend.unsupported_reason(HP) is None
