"""Delayed wgrad with tied weights and across calls: backward_dw accumulates (intended); TE's overwrite
(TE issue 3437) loses the first contribution, and the comparison shows it."""
import pytest
import torch

from te_verify.backends.te_eager import TEEagerBackend
from te_verify.matrix.te import contract_specs, delayed_specs
from te_verify.report.repro import case_check
from te_verify.run.caserun import CaseRun
from te_verify.te import api as te_api
from te_verify.te.reference import Linear
from te_verify.te.reference.linear import Linear as RefLinear


class Overwriting(RefLinear):
    backward_dw_overwrites = True


def _tied_run(cls, calls: int) -> torch.Tensor:
    torch.manual_seed(0)
    a, b = cls(16, 16, bias=False, delay_wgrad_compute=True, name="a"), cls(16, 16, bias=False, delay_wgrad_compute=True, name="b")
    b.weight = a.weight  # tied
    for k in range(calls):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(k))
        b(a(x)).sum().backward()
        assert a.weight.grad is None or k > 0  # backward returned None: nothing reached .grad yet
        a.backward_dw()
        b.backward_dw()
    return a.weight


def _eager_grad(weight: torch.Tensor, calls: int) -> torch.Tensor:
    w = weight.detach().clone().requires_grad_(True)
    for k in range(calls):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(k))
        (x @ w.t() @ w.t()).sum().backward()
    return w.grad


def test_tied_weights_accumulate_over_calls():
    for calls in (1, 2, 3):
        w = _tied_run(Linear, calls)
        torch.testing.assert_close(w.grad, _eager_grad(w, calls), rtol=1.3e-6, atol=1e-5)


def test_te_overwrite_behaviour_differs():
    w = _tied_run(Overwriting, 2)
    assert not torch.allclose(w.grad, _eager_grad(w, 2), rtol=1.3e-6, atol=1e-5)


def test_frozen_weight_backward_dw_is_a_no_op():
    m = Linear(16, 16, delay_wgrad_compute=True)
    m.weight.requires_grad_(False)
    m(torch.randn(8, 16, requires_grad=True)).sum().backward()
    m.backward_dw()
    assert m.weight.grad is None


def test_backward_dw_records_no_graph_when_the_saved_input_requires_grad():
    """backward_dw runs outside autograd's engine, with grad mode on: a wgrad GEMM that autograd recorded would save
    an operand (counted as a saved copy) and hand .grad a grad_fn. TE's GEMM records none; the reference neither."""
    m = Linear(16, 8, delay_wgrad_compute=True)
    x = torch.randn(4, 16, requires_grad=True)  # the case input: its saved view requires grad
    m(x).sum().backward()
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
        m.backward_dw()
    assert not packed and m.weight.grad is not None and m.weight.grad.grad_fn is None


# The reference build as a user's --te-impl module, judged below it (aten's GEMMs, autograd's saves): delayed wgrad
# over two microbatches (the second microbatch's backward_dw once saved an operand) and tied weights (aten's GEMMs on
# the shared weight were the last tying layer's, the oracle judges them under the first's).
REFERENCE_CASES = (
    ("cases/test_te_contract.py::test_te_contract[te_eager-lin4-w16.32.64.32.16-freeze0100-bias-x_grad-in16-fp32-r1"
     "-hp.dw.mb2]"),
    "cases/test_te_delayed.py::test_te_delayed[te_eager-lin4-w32.32.32.32.32-freeze0000-bias-x_grad-in16-fp32-r1-hp.dw.tied1_2]",
)


@pytest.mark.parametrize("nodeid", REFERENCE_CASES)
def test_reference_build_passes_its_delayed_wgrad_microbatch_and_tied_cases(nodeid):
    case_id = nodeid.split("[te_eager-")[1][:-1]
    specs = contract_specs("smoke") + delayed_specs("smoke")
    spec = next(s for s in specs if s.id == case_id)
    with te_api.using(te_api.resolve("te_verify.te.reference")):
        case = CaseRun(spec, "te_eager", TEEagerBackend())
        case_check(nodeid)(case)
    assert {v.check for v in case.verdicts} >= {"gemm_work", "te_saved_bytes"}
