"""Planted faults of the TE lane, each caught by its check, and the clean runs passing the same checks."""
import types

import pytest
import torch

from te_verify import te_api
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.backends.thunder_te import ThunderTEBackend
from te_verify.checks.gemm_log import gemm_work, saved_copies
from te_verify.checks.replay import replay_semantics
from te_verify.checks.te_contract import return_contract
from te_verify.checks.tolerances import Tolerance, tolerance_for
from te_verify.reference import linear as ref_linear
from te_verify.reference.gemm_probe import GemmProbe
from te_verify.reference.microbatch import run_mean_reduced, run_microbatches
from te_verify.spec import CaseSpec, TEConfig

ALT = (True, False, True, False)
PEFT = CaseSpec("te_peft", (32, 64, 128, 64, 32), ALT, ALT, False, (16,), te=TEConfig(recipe="delayed"))
BITWISE = Tolerance(0.0, 0.0, "same runtime")


def _impl(name: str, **overrides) -> te_api.TEImpl:
    """The reference API with some names replaced (a planted-fault --te-impl)."""
    base = te_api.resolve("reference")
    return te_api.TEImpl(name, "planted fault", types.SimpleNamespace(**{**vars(base.api), **overrides}))


class WgradForFrozen(ref_linear.Linear):
    """Fault: computes the weight gradient even for a frozen weight."""

    def grad_needs(self, needs_input_grad):
        dgrad, _, bgrad = super().grad_needs(needs_input_grad)
        return dgrad, True, bgrad

    def weight_grad_for_autograd(self, wgrad, delay):
        return super().weight_grad_for_autograd(wgrad, delay) if self.weight.requires_grad else None


class ReturnsRealWgrad(ref_linear.Linear):
    """Fault: with fuse_wgrad_accumulation it fills main_grad and also returns the real wgrad."""

    def weight_grad_for_autograd(self, wgrad, delay):
        super().weight_grad_for_autograd(wgrad, delay)
        return wgrad.to(self.weight.dtype)


class OverwritingBackwardDw(ref_linear.Linear):
    """TE's observed backward_dw: assigns .grad (TE issue 3437)."""

    backward_dw_overwrites = True


def test_clean_reference_passes_gemm_checks_on_both_backends():
    with te_api.using(te_api.resolve("reference")):
        for backend in (TEEagerBackend(), ThunderTEBackend()):
            got = run_mean_reduced(PEFT, backend, [GemmProbe()])
            assert gemm_work(PEFT.id, backend.name, PEFT, got).ok
            assert saved_copies(PEFT.id, backend.name, PEFT, got).ok


def test_wgrad_for_frozen_weights_is_caught():
    with te_api.using(_impl("planted.wgrad_for_frozen", Linear=WgradForFrozen)):
        got = run_mean_reduced(PEFT, TEEagerBackend(), [GemmProbe()])
    verdict = gemm_work(PEFT.id, "te_eager", PEFT, got)
    assert not verdict.ok
    assert "layer 2 (frozen weight): 1 wgrad GEMM, 0 required" in verdict.message
    assert "saved its input copy" in saved_copies(PEFT.id, "te_eager", PEFT, got).message


def test_thunder_executor_always_wgrad_fails_peft_check():
    """Upstream thunder behaviour (issue 2076): the PEFT check must fail on it."""
    with te_api.using(te_api.resolve("reference")):
        got = run_mean_reduced(PEFT, ThunderTEBackend(always_wgrad=True), [GemmProbe()])
    verdict = gemm_work(PEFT.id, "thunder_te", PEFT, got)
    assert not verdict.ok
    # Layer 2's backward also runs its dgrad, so the forced wgrad rides along; layer 0's backward symbol has no
    # used output at all and thunder's dead-code elimination drops it.
    assert "layer 2 (frozen weight): 1 wgrad GEMM, 0 required" in verdict.message


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


REPLAY = CaseSpec("te_replay", (32, 64, 32), (False, False), (False, False), True, (16,), replays=2,
                  te=TEConfig(recipe="delayed"))


def test_freeing_impl_both_backends_raise_alike():
    with te_api.using(te_api.resolve("te_verify.reference.freeing")):
        eager_te = run_mean_reduced(REPLAY, TEEagerBackend())
        thunder_te = run_mean_reduced(REPLAY, ThunderTEBackend())
    assert isinstance(eager_te.error, AttributeError) and eager_te.error_pass == 2
    assert replay_semantics(REPLAY.id, "thunder_te", eager_te, thunder_te, BITWISE).ok


class _DifferentOnReplay(torch.autograd.Function):
    """Fault: a compiled side that silently halves the gradient on the second backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.calls = 0
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        ctx.calls += 1
        return g if ctx.calls == 1 else g * 0.5


class SilentReplayThunderTE(ThunderTEBackend):
    def prepare(self, model, spec):
        fn = super().prepare(model, spec)
        return lambda x: _DifferentOnReplay.apply(fn(x))


def test_compiled_side_silently_different_on_replay_is_caught():
    with te_api.using(te_api.resolve("te_verify.reference.freeing")):
        eager_te = run_mean_reduced(REPLAY, TEEagerBackend())
    with te_api.using(te_api.resolve("reference")):  # the compiled side keeps its state and returns grads
        got = run_mean_reduced(REPLAY, SilentReplayThunderTE())
    verdict = replay_semantics(REPLAY.id, "thunder_te", eager_te, got, BITWISE)
    assert not verdict.ok and "raised AttributeError at backward pass 2" in verdict.message
