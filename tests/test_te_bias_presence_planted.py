"""grad_presence in the microbatch families (issue 34, item 4) on a planted fault of the reference implementation:
backward_dw giving a frozen bias a gradient (what TE 2.20.2's Linear does in high precision,
scripts/upstream/te_backward_dw_frozen_bias_grad.py). The clean twin is the reference's own delayed wgrad (its
functional backward, not eager's nn.Linear). te_contract reads the biases only: under main_grad a trained weight's
.grad is None by the contract, which a presence check over every parameter would blame on a correct build."""
import pytest
import torch

from te_verify.te import api as te_api
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.presence import grad_presence
from te_verify.te.reference import linear as ref_linear
from te_verify.run.microbatch import run_microbatches
from te_verify.spec import CaseSpec, TEConfig
from test_te_contract_planted import _impl

WEIGHTS_TRAINED, BIASES_FROZEN = (False, False), (True, False)  # layer 0: trained weight, frozen bias


class FrozenBiasGradInBackwardDw(ref_linear.Linear):
    """Fault: backward_dw also assigns a frozen bias a (zero) gradient, as TE's does when .grad is None."""

    def backward_dw(self) -> None:
        super().backward_dw()
        if self.bias is not None and not self.bias.requires_grad and self.bias.grad is None:
            self.bias.grad = torch.zeros_like(self.bias)


def _spec(family: str, main_grad: bool) -> CaseSpec:
    return CaseSpec(family, (16, 32, 16), WEIGHTS_TRAINED, BIASES_FROZEN, True, (16,),
                    te=TEConfig(None, "linear", main_grad=main_grad, delay_wgrad=True, microbatches=2))


@pytest.mark.parametrize("family, main_grad, suffix", [("te_delayed", False, ""), ("te_contract", True, ".bias")])
def test_frozen_bias_gradient_from_backward_dw_is_caught(family, main_grad, suffix):
    spec = _spec(family, main_grad)
    eager = run_microbatches(spec, EagerBackend())
    with te_api.using(te_api.resolve("reference")):
        clean = run_microbatches(spec, TEEagerBackend())
    verdict = grad_presence(spec.id, "te_eager", eager, clean, suffix)
    assert verdict.ok and verdict.figures["presence_points_compared"] >= 2, verdict.message
    with te_api.using(_impl("planted.frozen_bias_grad", Linear=FrozenBiasGradInBackwardDw)):
        got = run_microbatches(spec, TEEagerBackend())
    verdict = grad_presence(spec.id, "te_eager", eager, got, suffix)
    assert not verdict.ok
    assert "0.bias: has a gradient after pass 1, expected None" in verdict.message
    assert "1.bias" not in verdict.message and "weight" not in verdict.message


def test_contract_presence_reads_biases_only():
    """Under main_grad the reference (correct) leaves the trained weights' .grad None: only the biases are judged."""
    spec = _spec("te_contract", True)
    eager = run_microbatches(spec, EagerBackend())
    with te_api.using(te_api.resolve("reference")):
        clean = run_microbatches(spec, TEEagerBackend())
    assert not grad_presence(spec.id, "te_eager", eager, clean).ok  # every parameter: the weights' None blamed
    assert grad_presence(spec.id, "te_eager", eager, clean, ".bias").ok
