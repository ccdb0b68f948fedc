"""FP8 gradients against the reference that quantizes the same operands with the same scales (te_case.output_reference
carried through backward) and its fp64 truth (te_case.quantized_truth), on TE's Python over the tex emulation: TE's
Linear lands within accumulation noise of it, where fp32 eager is a quantization error away; the reference models
TE's bias epilogue (an fp32 bias rounded to bf16 for an FP8 GEMM), and the bound sees the reference without it."""
import pytest

from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.fp8_tolerance import fp8_bound
from te_verify.checks.parity import grad_parity
from te_verify.checks.tolerances import tolerance_for
from te_verify.te.reference.functional import ops_bias_epilogue
from te_verify.run.microbatch import run_mean_reduced
from te_verify.spec import CaseSpec, TEConfig
from te_verify.run.te_case import output_reference, quantized_truth

RECIPES = [("delayed", "E4M3"), ("current", "E4M3"), ("delayed", "HYBRID"), ("current", "HYBRID")]


def stack(recipe: str, fp8_format: str) -> CaseSpec:
    return CaseSpec("te_fp8", (32, 64, 32), (False, False), (False, False), True, (16,),
                    te=TEConfig(recipe=recipe, fp8_format=fp8_format))


pytestmark = pytest.mark.usefixtures("te_python")  # TE's Python over the emulation (tests/conftest.py)


@pytest.mark.parametrize("recipe, fp8_format", RECIPES)
def test_te_linear_gradients_are_within_accumulation_noise_of_the_quantized_reference(recipe, fp8_format):
    spec = stack(recipe, fp8_format)
    got = run_mean_reduced(spec, TEEagerBackend())
    quantized, bound = output_reference(spec), fp8_bound(spec, quantized_truth(spec))
    verdict = grad_parity(spec.id, "te_eager", quantized, got, tolerance_for(spec), bound=bound)
    assert verdict.ok, verdict.message
    # unquantized fp32 math is the quantization error away: what the recipe's tolerance against eager had to allow
    eager = run_mean_reduced(spec, EagerBackend())
    unquantized = grad_parity(spec.id, "eager", quantized, eager, tolerance_for(spec), bound=bound)
    assert not unquantized.ok and "grad of 0.weight" in unquantized.message


@pytest.mark.parametrize("recipe, fp8_format", RECIPES[:2])
def test_a_reference_adding_the_fp32_bias_is_caught_by_the_bound(recipe, fp8_format):
    """TE's Linear rounds an fp32 bias to bf16 for its FP8 GEMM; the activations it feeds round to other FP8 values."""
    spec = stack(recipe, fp8_format)
    got = run_mean_reduced(spec, TEEagerBackend())
    with ops_bias_epilogue():
        wrong, wrong_truth = output_reference(spec), quantized_truth(spec)
    verdict = grad_parity(spec.id, "te_eager", wrong, got, tolerance_for(spec), bound=fp8_bound(spec, wrong_truth))
    assert not verdict.ok and "grad of 1.weight" in verdict.message, verdict.message
