"""Accumulation orders (issue 34, item 5) on a planted fault: a TE build whose wgrad reads the input of the module's
latest forward (kept on the module) instead of its own forward's. Its gradients are right whenever each backward
follows its own forward (the interleaved order every case ran before); with every forward first
(te.accumulation "forwards_first") microbatch 1's wgrad reads microbatch 2's input, and grad_parity names the
weights. The clean twin, the reference's Linear (its input saved on the autograd context), passes in both orders."""
import pytest
import torch

from te_verify.te import api as te_api
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.parity import grad_parity
from te_verify.checks.tolerances import tolerance_for
from te_verify.te.reference import linear as ref_linear
from te_verify.run.microbatch import run_microbatches
from te_verify.spec import CaseSpec, TEConfig
from planted_orders import LatestInputLinear
from test_te_contract_planted import _impl


class LastInputWgrad(ref_linear.Linear):
    """Fault: keeps its last forward's input on the module for the wgrad."""

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        self.latest_input = inp.detach()
        return LatestInputLinear.apply(inp, self.weight, self.bias, self)


def _spec(order: str) -> CaseSpec:
    return CaseSpec("te_contract", (16, 32, 16), (False, False), (False, False), True, (16,),
                    te=TEConfig(None, "linear", microbatches=2, accumulation=order))


def _parity(spec: CaseSpec, impl: te_api.TEImpl) -> list:
    """grad_parity against eager after the first microbatch and after the last."""
    eager = run_microbatches(spec, EagerBackend())
    with te_api.using(impl):
        got = run_microbatches(spec, TEEagerBackend())
    return [grad_parity(spec.id, "te_eager", eager, got, tolerance_for(spec), k) for k in (0, -1)]


@pytest.mark.parametrize("order", ["interleaved", "forwards_first"])
def test_clean_reference_passes_in_both_orders(order):
    verdicts = _parity(_spec(order), te_api.resolve("reference"))
    assert all(v.ok for v in verdicts), [v.message for v in verdicts]


def test_wgrad_from_the_latest_forward_is_caught_only_forwards_first():
    planted = _impl("planted.last_input_wgrad", Linear=LastInputWgrad)
    assert all(v.ok for v in _parity(_spec("interleaved"), planted))  # invisible where backward follows forward
    first, last = _parity(_spec("forwards_first"), planted)
    assert not first.ok and not last.ok
    assert "grad of 0.weight" in first.message and "grad of 1.weight" in first.message
    assert ".bias" not in first.message  # the bias gradient needs no input: right in either order
