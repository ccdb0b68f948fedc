"""FP8 under torch.autocast(bf16) over fp32 parameters (te_autocast with a recipe), judged as the family's cases are:
gradients against te_verify.te.reference on the same FP8 operands within its fp64 truth's bound. TE 2.20.2 over the
tex emulation (the clean twin, TE's own code) passes with both tensor-scaled recipes. Two faults specific to FP8 under
autocast fail naming the weights: a build quantizing the bf16 casts of the input and weight instead of the fp32 tensors
(tests/planted_te_autocast_fp8.py: what thunder's TE executor does, expectations/thunder_te.toml), and a build keeping
its wgrad in fp32 where TE emits bf16 (tests/planted_te_autocast_fp32_wgrad.py); the input's gradient, which neither
changes by itself in the last layer, is judged too."""
import pytest

from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.fp8_tolerance import fp8_bound
from te_verify.checks.parity import grad_parity
from te_verify.checks.tolerances import tolerance_for
from te_verify.run.microbatch import run_mean_reduced
from te_verify.run.te_case import output_reference, quantized_truth
from te_verify.spec import CaseSpec, TEConfig
from te_verify.te import api as te_api


def _spec(recipe: str) -> CaseSpec:
    return CaseSpec("te_autocast", (32, 64, 32), (False, False), (False, False), True, (16,),
                    te=TEConfig(recipe=recipe), autocast="bf16")


def _parity(impl: str, recipe: str = "delayed"):
    spec = _spec(recipe)
    with te_api.using(te_api.resolve(te_api.CPU_CHOICE)):  # the reference's run does not depend on the build judged
        quantized = output_reference(spec)
        bound = fp8_bound(spec, quantized_truth(spec))
    with te_api.using(te_api.resolve(impl)):
        got = run_mean_reduced(spec, TEEagerBackend(), follow=quantized)
    assert got.error is None, got.error
    return grad_parity(spec.id, impl, quantized, got, tolerance_for(spec), bound=bound)


@pytest.mark.parametrize("recipe", ("delayed", "current"))
def test_te_under_autocast_with_a_recipe_passes(recipe):
    verdict = _parity(te_api.CPU_CHOICE, recipe)
    assert verdict.ok, verdict.message


def test_quantizing_the_bf16_casts_fails_naming_the_weights():
    verdict = _parity("planted_te_autocast_fp8")
    assert not verdict.ok
    assert "iteration 1: grad of 0.weight" in verdict.message and "grad of 1.weight" in verdict.message


def test_a_wgrad_kept_in_fp32_fails_naming_the_weights():
    verdict = _parity("planted_te_autocast_fp32_wgrad")
    assert not verdict.ok
    assert "iteration 1: grad of 0.weight" in verdict.message and "grad of 1.weight" in verdict.message
    assert "grad of 0.bias" not in verdict.message, verdict.message
