"""A TE build whose Linear computes every weight gradient 5% off (planted_te_wgrad: in the wgrad GEMM, so returned,
main_grad-accumulated and delayed wgrads alike) fails every te_eager pr case that trains a TE Linear and completes
its backward, FP8 cases and known-gap cases included, naming each trained weight beside the gap; the same cases on
TE's own build end as the suite records them (passed, or exactly their known gaps).

The cases run through their own case functions (cases/test_te_*.py) on TE's Python over the tex emulation and are
judged as the plugin judges them: their verdicts against the expectations covering them (te_verify.expectations.judge).
Excluded, each for the reason EXCLUDED gives: LoRA over TE (its TE Linears are the adapters' frozen bases: no TE
wgrad), GroupedLinear and te.ops kinds (not TE's Linear), no trainable weight, FP8 widths TE refuses at forward, and
delayed wgrad beside a frozen weight (backward_dw raises: backward never completes, a recorded gap).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from te_verify.backends.te_eager import TEEagerBackend
from te_verify.run.caserun import CaseRun
from te_verify.checks.verdict import CheckFailures, Verdict
from te_verify.expectations.entries import covering, current_env, load_expectations
from te_verify.expectations.judge import Judgement, check_results, judge
from te_verify.models import frozen_at_backward
from te_verify.matrix.selection import select_pr
from te_verify.spec import CaseSpec
from planted_te_wgrad import wgrad_off_by
from proof_tier import PROOF_TIER
from loading import load_file

CASES = Path(__file__).resolve().parent.parent / "cases"


FAMILIES = [load_file(path, f"te_wgrad_planted_{path.stem}") for path in sorted(CASES.glob("test_te_*.py"))]
FP8_FAMILY = next(m for m in FAMILIES if m.FAMILY == "te_fp8")


def trained_weights(spec: CaseSpec) -> list[str]:
    """The weights that require a gradient when backward runs."""
    return [n for n, p in frozen_at_backward(spec).named_parameters() if n.endswith("weight") and p.requires_grad]


def frozen_weights(spec: CaseSpec) -> list[str]:
    return [n for n, p in frozen_at_backward(spec).named_parameters() if n.endswith("weight") and not p.requires_grad]


EXCLUDED = (
    (lambda s: s.model is not None, "LoRA over TE: its TE Linears are the adapters' frozen bases (no TE wgrad)"),
    (lambda s: s.te.module != "linear", "not TE's Linear (GroupedLinear, te.ops or the fused MLP)"),
    (lambda s: not trained_weights(s), "no trainable weight"),
    (lambda s: s.te.recipe and FP8_FAMILY.refused_layers(s), "FP8 refuses a width: TE raises at forward, no backward"),
    (lambda s: s.te.delay_wgrad and frozen_weights(s), "backward_dw raises 'Pop empty queue' beside a frozen weight "
                                                        "(recorded gap): backward never completes"),
)


def exclusion(spec: CaseSpec) -> str | None:
    return next((why for rule, why in EXCLUDED if rule(spec)), None)


def _pr_cases() -> list:
    """(case function, spec) of every te_eager pr case of the TE families, as the plugin selects them."""
    cases = []
    for module in FAMILIES:
        chosen, _ = select_pr(module.FAMILY, "te_eager", module.SPECS("pr"))
        cases += [pytest.param(getattr(module, f"test_{module.FAMILY}"), s, id=f"{module.FAMILY}-{s.id}")
                  for s in chosen]
    return cases


def _main_grad_case() -> list:
    """A te.Linear main_grad case without delayed wgrad, beside the pr tier's: the pairwise choice may cover the
    main_grad pairs with cases the exclusions drop (a frozen weight under delay_wgrad)."""
    from cases import test_te_contract as family

    spec = next(s for s in family.SPECS("pr") if s.te.module == "linear" and s.te.main_grad and not s.te.delay_wgrad)
    return [pytest.param(family.test_te_contract, spec, id=f"te_contract-{spec.id}")]


def _cover(cases: list) -> list:
    """One case per family, recipe, FP8 format, main_grad, delayed wgrad and dtype: the test command's share (the
    proof tier smoke); scripts/proofs.sh runs every included pr case (tests/proof_tier.py)."""
    chosen: dict = {}
    for c in cases:
        s = c.values[1]
        chosen.setdefault((s.family, s.te.recipe, s.te.fp8_format, s.te.main_grad, s.te.delay_wgrad, s.dtype), c)
    return list(chosen.values())


PR_CASES = _pr_cases() + _main_grad_case()
_ALL_INCLUDED = [c for c in PR_CASES if exclusion(c.values[1]) is None]
INCLUDED = _cover(_ALL_INCLUDED) if PROOF_TIER == "smoke" else _ALL_INCLUDED


pytestmark = pytest.mark.usefixtures("te_python")  # TE's Python over the emulation (tests/conftest.py)


def verdicts_of(case_function, spec: CaseSpec) -> list[Verdict]:
    """Every verdict the case's checks returned, whether or not it passed."""
    case = CaseRun(spec, "te_eager", TEEagerBackend())
    try:
        case_function(case)
    except CheckFailures:
        pass
    return case.verdicts


EXPECTATIONS = load_expectations(CASES.parent / "expectations")


def judgement_of(case_function, spec: CaseSpec) -> Judgement:
    """The case judged as the plugin judges it: its verdicts against the expectations covering it."""
    family = spec.family
    nodeid = f"cases/test_{family}.py::test_{family}[te_eager-{spec.id}]"
    entries = [e for e in covering(EXPECTATIONS, "te_eager", spec.id, nodeid, current_env(), family)
               if e.status == "xfail"]
    return judge(entries, check_results(verdicts_of(case_function, spec)))


def gap_elements(judgement: Judgement) -> set[str]:
    """The weights a held gap's `elements` name (its check does not judge them)."""
    return {el for e in judgement.held for el in e.elements}


def test_the_included_cases_span_the_recipes_formats_and_known_gap_families():
    """The exclusions leave FP8 stacks of both recipes and formats, PEFT, high precision, the replays (whose second
    backward is TE issue 990's known gap), main_grad and the delayed wgrad."""
    specs = [c.values[1] for c in INCLUDED]
    assert {"te_fp8", "te_peft", "te_replay", "te_contract", "te_delayed"} <= {s.family for s in specs}
    assert any(s.te.main_grad for s in specs) and any(s.te.delay_wgrad for s in specs)
    assert {(s.te.recipe, s.te.fp8_format) for s in specs} >= {("delayed", "E4M3"), ("current", "E4M3"),
                                                                ("delayed", "HYBRID"), ("current", "HYBRID"),
                                                                (None, "E4M3")}


@pytest.mark.parametrize("case_function, spec", INCLUDED)
def test_a_wgrad_5_percent_off_fails_the_case_naming_every_trained_weight(case_function, spec):
    clean = judgement_of(case_function, spec)
    assert clean.outcome in ("passed", "xfailed"), clean.message
    with wgrad_off_by():
        planted = judgement_of(case_function, spec)
    assert planted.outcome == "failed", f"a wgrad 5% off ended {planted.outcome}: {planted.checks}"
    named = [w for w in trained_weights(spec) if w not in gap_elements(clean)]
    missing = [w for w in named if not re.search(rf"(?<![\w.]){re.escape(w)}(?![\w.])", planted.message)]
    assert named and not missing, f"the failure does not name {missing}: {planted.message}"
    if clean.outcome == "xfailed":
        assert "FAILED BESIDE A KNOWN GAP" in planted.message, planted.message
