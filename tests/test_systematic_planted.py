"""A 1% lean (issue 25) fails `grad_scale` in bf16 and in FP8, in the torch lane and the TE lane, including where the
normwise or elementwise bound lets it pass; correct implementations written otherwise (another accumulation order,
fp64 inside) pass the same cases. The TE cases run through their own case functions on TE's Python over the tex
emulation."""
from __future__ import annotations

from pathlib import Path

import pytest
from planted_accumulation import Fp64Inside, OtherAccumulation
from planted_backends import LeansOnePercent, OffByOnePercent
from planted_te_wgrad import gradient_gemm_off_by

from te_verify.backends.te_eager import TEEagerBackend
from te_verify.run.caserun import CaseRun
from te_verify.checks.verdict import CheckFailures, Verdict
from te_verify.matrix.stacks import FAMILIES
from te_verify.matrix.models import litgpt_lora_specs
from te_verify.matrix.te import _lora, bf16_stack, fp8_specs
from te_verify.spec import CaseSpec
from loading import load_file

CASES = Path(__file__).resolve().parent.parent / "cases"
BF16_STACK = next(s for s in FAMILIES["dtype"]("pr")
                  if s.id == "lin4-w32.32.32.32.32-freeze0000-bias-x_grad-in4x6-bf16-r1")
# The bf16 model-family spec of the pr tier whose largest weight gradient resolves a 1% lean (most do not: docs/tolerances.md).
BF16_FAMILY = next(s for s in litgpt_lora_specs("pr") if s.dtype == "bf16")
# A TE Linear stack in bf16, high precision: held to its fp64 truth as te_peft's and te_moe's are (verify_te_stack),
# sized to resolve a 1% lean as the lane's bf16 cases are (matrix.te.bf16_stack; tests/test_bf16_te_planted.py).
TE_BF16 = bf16_stack("te_peft", (False,) * 4, (False,) * 4, True)
FP8_STACK = next(s for s in fp8_specs("pr") if s.id.startswith("lin4-w32.64.128.64.32-freeze0000") and
                 s.te.recipe == "delayed" and s.te.fp8_format == "E4M3")
# What fp64 inside costs that eager does not (fp64 copies saved for backward, a higher peak): the waste checks'.
WASTE = {"waste_saved", "waste_peak"}


def checks_of(run, case: CaseRun) -> dict[str, Verdict]:
    """Every verdict of the case by check name, whether or not it passed."""
    try:
        run(case)
    except CheckFailures:
        pass
    return {v.check: v for v in case.verdicts}


def failing(checks: dict[str, Verdict]) -> list[str]:
    return [name for name, v in checks.items() if not v.ok]


@pytest.mark.parametrize("backend", [OtherAccumulation(), Fp64Inside()], ids=lambda b: b.name)
@pytest.mark.parametrize("spec", [BF16_STACK, BF16_FAMILY], ids=["stack", "family"])
def test_correct_implementations_written_otherwise_pass(spec, backend):
    checks = checks_of(CaseRun.verify, CaseRun(spec, backend.name, backend))
    assert checks["grad_scale"].ok and checks["grad_scale"].figures["grad_scale_gradients"] >= 4
    assert set(failing(checks)) <= (WASTE if backend.name == "fp64_inside" else set()), failing(checks)


def test_a_one_percent_weight_gradient_in_a_bf16_stack_fails_grad_scale_naming_it():
    """The stack's normwise bound catches it too (a 1% error is 2.77x eager's there, docs/tolerances.md): both name it."""
    checks = checks_of(CaseRun.verify, CaseRun(BF16_STACK, "planted_off_by_1pct", OffByOnePercent()))
    assert "grad of 1.weight leans 1.00" in checks["grad_scale"].message, checks["grad_scale"].message
    assert "grad of 1.weight: error vs the fp64 truth" in checks["grad_parity"].message


def test_a_one_percent_lean_in_a_bf16_model_family_passes_grad_parity_and_fails_grad_scale():
    """A model family's elementwise bound (2x eager's deviation from fp64) lets every element 1% off through."""
    checks = checks_of(CaseRun.verify, CaseRun(BF16_FAMILY, "planted_leans_1pct", LeansOnePercent()))
    assert failing(checks) == ["grad_scale"], failing(checks)
    assert "grad of lm_head.linear.weight leans 1.00" in checks["grad_scale"].message, checks["grad_scale"].message


def _case_function(family: str):
    return getattr(load_file(CASES / f"test_{family}.py", f"systematic_{family}"), f"test_{family}")


def te_checks(spec: CaseSpec, role: str | None = None) -> dict[str, Verdict]:
    """The te_eager case's verdicts, on TE's own build or with its Linear's `role` GEMM 1% too large."""
    run, case = _case_function(spec.family), CaseRun(spec, "te_eager", TEEagerBackend())
    if role is None:
        return checks_of(run, case)
    with gradient_gemm_off_by(1.01, role):
        return checks_of(run, case)


def test_a_te_linear_whose_bf16_dgrad_is_one_percent_large_fails_grad_scale(te_python):
    clean = te_checks(TE_BF16)
    assert not failing(clean) and clean["grad_scale"].figures["grad_scale_gradients"] >= 4, failing(clean)
    planted = te_checks(TE_BF16, "dgrad")
    message = planted["grad_scale"].message
    assert "grad of <input> leans 1.0" in message and "grad of 0.weight leans 1.0" in message, message


def test_an_fp8_wgrad_one_percent_large_fails_grad_scale_against_the_quantized_truth(te_python):
    clean = te_checks(FP8_STACK)  # its known gaps (fp8_copies, te_saved_bytes: expectations/te_eager.toml) aside
    assert clean["grad_parity"].ok and clean["grad_scale"].ok
    assert clean["grad_scale"].figures["grad_scale_gradients"] >= 4
    message = te_checks(FP8_STACK, "wgrad")["grad_scale"].message
    assert "te_verify.te.reference on the same FP8 operands" in message
    for weight in ("0.weight", "1.weight", "2.weight", "3.weight"):
        assert f"grad of {weight} leans 1.0" in message, message


def test_the_issues_te_lora_case_says_it_cannot_resolve_a_one_percent_lean(te_python):
    """Issue 25's te_lora bf16 case: correct bf16 Llama blocks lean about 1% apart, so every judged gradient's
    allowance exceeds 1% there (docs/tolerances.md); the row says so instead of passing silently. Its planted dgrad 1% too large
    leans the LoRA gradients it reaches by 0.2-0.9%, within that."""
    figures = te_checks(_lora("all", False, "bf16"))["grad_scale"].figures
    assert figures["grad_scale_gradients"] >= 10 and figures["grad_scale_dispersion"] > 2
    assert figures["grad_scale_unresolved"] >= figures["grad_scale_gradients"]
