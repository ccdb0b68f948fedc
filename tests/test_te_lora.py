"""LoRA over TE Linear on the TE lane (issue 12), on TE's real Python over the tex emulation: a clean te_eager run
passes every check of cases/test_te_lora.py; a planted wgrad GEMM for a frozen TE base, whose result is discarded
(gradients still match eager), is caught by the GEMM check with a message naming the base site. In FP8, a run
quantizing linears beyond the TE sites (as thunder's TE executor does) is judged against the same-quantization
reference with those quantized too: clean it passes, with a wrong scale on a claimed linear it fails naming it."""
import pytest

from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.run.caserun import CaseRun
from te_verify.checks.te_family import te_family_gemms, te_family_waste
from te_verify.checks.tolerances import derived_tolerance
from te_verify.matrix.te import _lora
from te_verify.probes import default_probes
from te_verify.probes.tex_gemm import AtenGemmOutsideTex
from te_verify.run.runner import run_case, run_fp64_eager
from te_verify.run.te_case import fp8_value_verdicts, output_reference, run_te
from planted_te_lora import ClaimingTE, WastedBaseWgradTE

SPEC = _lora("qv", True, "fp32")
DELAYED = _lora("qv", True, "fp32", "delayed")
CLAIMS = ("blocks.0.attn.k", "blocks.0.mlp.fc_1")  # plain torch Linears of the model, no TE sites


pytestmark = pytest.mark.usefixtures("te_python")  # TE's Python over the emulation (tests/conftest.py)


def _verdicts(backend):
    got = run_case(SPEC, backend, [*default_probes("te_eager"), AtenGemmOutsideTex()])
    ref = run_case(SPEC, EagerBackend())
    tol = derived_tolerance(SPEC, ref, run_fp64_eager(SPEC))
    standard = CaseRun(SPEC, "te_eager", backend).standard_verdicts(ref, got, tol)
    return got, standard, te_family_waste(SPEC.id, "te_eager", SPEC, got)


def test_clean_te_eager_passes_and_its_bases_run_no_wgrad():
    got, standard, waste = _verdicts(TEEagerBackend())
    assert all(v.ok for v in standard + waste), [v.message for v in standard + waste if not v.ok]
    figures = waste[0].figures
    assert figures["te_sites"] == 2 and figures["tex_wgrads_te_sites"] == 0
    assert figures["tex_gemms_te_sites"] == 4  # per base: fprop, and dgrad (the norm before it trains)
    assert figures["flops_actual"] == figures["flops_required"]


def test_a_discarded_wgrad_of_a_frozen_te_base_is_caught_naming_the_site():
    got, standard, _ = _verdicts(WastedBaseWgradTE())
    assert all(v.ok for v in standard), [v.message for v in standard if not v.ok]  # the gradients cannot tell
    verdict = te_family_gemms(SPEC.id, "te_eager", SPEC, got)
    assert not verdict.ok
    for site in ("blocks.0.attn.q.base", "blocks.0.attn.v.base"):
        assert f"site {site} (frozen weight): 1 wgrad GEMM in backward pass 1, 0 required" in verdict.message


def test_a_base_not_run_by_te_is_named():
    """The bases' GEMMs must come from the tex record: plain eager runs them through aten only."""
    got = run_case(SPEC, EagerBackend(), [*default_probes("te_eager"), AtenGemmOutsideTex()])
    verdict = te_family_gemms(SPEC.id, "eager", SPEC, got)
    assert not verdict.ok and "site blocks.0.attn.q.base (TE Linear): 2 GEMM(s) ran outside TE (aten)" in verdict.message


def _claiming_verdicts(backend: ClaimingTE) -> tuple[CaseRun, dict]:
    """The FP8 value checks of cases/test_te_lora.py on `backend` (named te_eager: the lane's probes and tolerance)."""
    case = CaseRun(DELAYED, "te_eager", backend)
    quantized = output_reference(DELAYED, backend=backend)
    got = run_te(case, follow=quantized)
    assert got.figures["te_layers_claimed"] == sorted(["blocks.0.attn.q.base", "blocks.0.attn.v.base", *CLAIMS])
    return case, {v.check: v for v in fp8_value_verdicts(case, got, quantized)}


def test_linears_quantized_beyond_the_te_sites_are_judged_against_a_reference_quantizing_them():
    case, verdicts = _claiming_verdicts(ClaimingTE(CLAIMS))
    assert all(v.ok for v in verdicts.values()), [v.message for v in verdicts.values() if not v.ok]
    assert set(verdicts) == {"output_parity", "replay", "grad_parity", "grad_scale", "params_after_steps"}
    assert verdicts["grad_parity"].figures["grads_compared"] > 0
    assert str(list(CLAIMS)) in case.figures["fp8_grad_reference"]


def test_a_claimed_linear_quantized_with_a_wrong_scale_fails_naming_it():
    _, verdicts = _claiming_verdicts(ClaimingTE(CLAIMS, wrong_scale_on="blocks.0.mlp.fc_1"))
    for check in ("output_parity", "grad_parity", "params_after_steps"):
        assert not verdicts[check].ok, check
        assert "iteration 1" not in verdicts[check].message  # the scale is wrong from the second forward on
        assert f"the reference quantized {list(CLAIMS)} as the run did" in verdicts[check].message
    assert "iteration 2: grad of blocks.0.attn.q.lora_a.weight" in verdicts["grad_parity"].message
