"""Delayed wgrad with tied weights and across calls: backward_dw accumulates (intended); TE's overwrite
(TE issue 3437) loses the first contribution, and the comparison shows it."""
import torch

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
