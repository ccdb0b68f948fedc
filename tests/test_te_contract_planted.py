"""The wgrad return contract check (seed 002) on planted faults of the reference implementation: a real wgrad
where the contract says None or dummy (double accumulation), and backward_dw assigning .grad (TE issue 3437).
Real TE's own behaviour is in the te_contract and te_delayed families, against the same check."""
import types

import pytest

from te_verify.te import api as te_api
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.te_contract import return_contract
from te_verify.checks.tolerances import Tolerance, tolerance_for
from te_verify.te.reference import linear as ref_linear
from te_verify.run.microbatch import run_microbatches
from te_verify.spec import CaseSpec, TEConfig

BITWISE = Tolerance(0.0, 0.0, "same runtime")


def _impl(name: str, **overrides) -> te_api.TEImpl:
    """The reference API with some names replaced (a planted-fault --te-impl)."""
    base = te_api.resolve("reference")
    api = types.SimpleNamespace(**{**vars(base.api), **overrides})
    return te_api.TEImpl(name, te_api.EXTERNAL, "planted fault", f"{name} (planted)", lambda: api)


class ReturnsRealWgrad(ref_linear.Linear):
    """Fault: with fuse_wgrad_accumulation it fills main_grad and also returns the real wgrad."""

    def weight_grad_for_autograd(self, wgrad, delay):
        super().weight_grad_for_autograd(wgrad, delay)
        return wgrad.to(self.weight.dtype)


class OverwritingBackwardDw(ref_linear.Linear):
    """TE's observed backward_dw: assigns .grad (TE issue 3437)."""

    backward_dw_overwrites = True


@pytest.mark.parametrize("added", [False, True])
@pytest.mark.parametrize("microbatches", [2, 3])
def test_real_wgrad_where_contract_says_none_or_dummy_is_caught(added, microbatches):
    spec = CaseSpec("te_contract", (16, 32, 16), (False, False), None, True, (16,),
                    te=TEConfig(None, "linear", True, added, False, microbatches))
    ref = run_microbatches(spec, EagerBackend())
    with te_api.using(te_api.resolve("reference")):
        clean = run_microbatches(spec, TEEagerBackend())
    assert return_contract(spec.id, "te_eager", spec, "linear", ref, clean, tolerance_for(spec)).ok
    with te_api.using(_impl("planted.real_wgrad", Linear=ReturnsRealWgrad)):
        got = run_microbatches(spec, TEEagerBackend())
    verdict = return_contract(spec.id, "te_eager", spec, "linear", ref, got, tolerance_for(spec))
    assert not verdict.ok
    assert "backward returned wgrad after microbatch 1" in verdict.message
    assert "accumulated twice" in verdict.message


def test_backward_dw_overwrite_is_caught():
    spec = CaseSpec("te_delayed", (16, 32, 16), (False, False), None, True, (16,),
                    te=TEConfig(None, "linear", delay_wgrad=True, microbatches=2))
    undelayed = spec.replace(te=TEConfig(None, "linear", microbatches=2))
    with te_api.using(te_api.resolve("reference")):
        ref = run_microbatches(undelayed, TEEagerBackend())
        assert return_contract(spec.id, "te_eager", spec, "linear", ref, run_microbatches(spec, TEEagerBackend()), BITWISE).ok
    with te_api.using(_impl("planted.te_backward_dw", Linear=OverwritingBackwardDw)):
        got = run_microbatches(spec, TEEagerBackend())
    verdict = return_contract(spec.id, "te_eager", spec, "linear", ref, got, BITWISE)
    assert not verdict.ok and ".grad after 2 microbatches" in verdict.message
