"""Planted faults for the observables the gradient checks cannot see (issue 10's audit): a wrong forward output
with exact gradients, a forward that writes into a parameter, a --te-impl that runs a GEMM no log of the suite
sees, and a delayed wgrad written into main_grad during backward(). Each is caught with a message naming the
element; the clean run passes the same checks."""
from __future__ import annotations

import types

import pytest
import torch

from planted_backends import WritesFrozenBias, WrongOutput
from te_verify.te import api as te_api
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.run.caserun import CaseRun
from te_verify.checks.state import output_parity, state_left_behind
from te_verify.checks.te_contract import return_contract
from te_verify.checks.te_waste import te_waste
from te_verify.checks.tolerances import tolerance_for
from te_verify.probes import default_probes
from te_verify.te.reference import linear as ref_linear
from te_verify.te.reference import wgrad as wg
from te_verify.run.microbatch import run_mean_reduced, run_microbatches
from te_verify.spec import CaseSpec, TEConfig

ALT = (True, False, True, False)
SPEC = CaseSpec("freeze", (32, 64, 128, 64, 32), ALT, ALT, True, (4, 6), "fp32", 1)
TE_PLAIN = CaseSpec("te_peft", (32, 64, 128, 64, 32), ALT, ALT, False, (16,), te=TEConfig(recipe=None))
DELAYED = CaseSpec("te_delayed", (16, 32, 16), (False, False), None, True, (16,),
                   te=TEConfig(None, "linear", main_grad=True, delay_wgrad=True, microbatches=2))


def _failure(spec: CaseSpec, backend) -> str:
    with pytest.raises(AssertionError) as info:
        CaseRun(spec, backend.name, backend).verify()
    return str(info.value)


def test_wrong_forward_output_with_exact_gradients_is_caught_by_output_parity_only():
    message = _failure(SPEC.replace(warmup_steps=1), WrongOutput())
    assert "forward output (warm-up step 1): error vs the fp64 truth" in message  # the warm-up step's output
    for k in (1, 2, 3):  # every training iteration's
        assert f"forward output (iteration {k}): error vs the fp64 truth" in message
    assert "max abs err vs eager" in message
    assert "grad of" not in message  # every gradient is exact


def test_forward_writing_into_a_frozen_parameter_is_caught_by_state_left_behind():
    message = _failure(SPEC, WritesFrozenBias())
    assert "param:0.bias after the run: max abs err" in message
    assert "(written by the run; the reference leaves it unchanged)" in message and "rtol=0, atol=0" in message
    assert "0.bias after step 1: changed, the reference's step left it unchanged" in message  # params_after_steps
    assert "forward output (iteration 1)" not in message  # the first forward read the bias before writing it


@pytest.mark.parametrize("spec", [SPEC, SPEC.replace(warmup_steps=1)], ids=["r1", "warmup1"])
def test_clean_eager_passes_output_and_state_checks(spec):
    verdicts = CaseRun(spec, "eager", EagerBackend()).verify()
    figures = {k: v for verdict in verdicts for k, v in verdict.figures.items()}
    assert figures["outputs_compared"] == spec.iterations + spec.warmup_steps
    assert figures["state_tensors_compared"] == 8


def test_warm_up_of_a_case_with_nothing_trainable_runs_forward_only():
    """The nightly's hypothesis draw of 2026-11-30: every weight frozen, no bias, no input gradient, a warm-up step.
    The warm-up has nothing to run backward through; the measured step's backward raises in eager and in the backend
    alike, and ending compares the raise (before, the warm-up raised and the case failed as unbuildable)."""
    spec = CaseSpec("generated", (1, 1), (True,), None, False, (1,), "fp32", 1, warmup_steps=1)
    verdicts = {v.check: v for v in CaseRun(spec, "eager", EagerBackend()).verify()}
    assert all(v.ok for v in verdicts.values())
    assert verdicts["output_parity"].figures["outputs_compared"] == 2  # the warm-up's forward and iteration 1's
    assert verdicts["ending"].figures["passes_ref"] == verdicts["ending"].figures["passes_got"] == 0


class _ExtraWgradFunction(ref_linear._LinearFunction):
    """Backward also recomputes the wgrad with a bare torch.mm that logs nothing (and discards it)."""

    @staticmethod
    def forward(ctx, x, weight, bias, module):
        ctx.x = x  # not saved through autograd: the fault is the GEMM, not the bytes
        return ref_linear._LinearFunction.forward(ctx, x, weight, bias, module)

    @staticmethod
    def backward(ctx, grad_out):
        grads = ref_linear._LinearFunction.backward(ctx, grad_out)
        if ctx.needs_input_grad[1]:
            torch.mm(grad_out.reshape(-1, grad_out.shape[-1]).t(), ctx.x.reshape(-1, ctx.x.shape[-1]))
        return grads


class ExtraWgradLinear(ref_linear.Linear):
    def forward(self, inp, is_first_microbatch=None):
        self.state.label = self.name
        return _ExtraWgradFunction.apply(inp, self.weight, self.bias, self)


def _planted_impl(name: str, kind: str, **overrides) -> te_api.TEImpl:
    api = types.SimpleNamespace(**{**vars(te_api.resolve("reference").api), **overrides})
    return te_api.TEImpl(name, kind, "planted fault", f"{name} (planted)", lambda: api)


def _te_waste_of(impl: te_api.TEImpl) -> dict:
    with te_api.using(impl):
        got = run_mean_reduced(TE_PLAIN, TEEagerBackend(), default_probes("te_eager"))
    return {v.check: v for v in te_waste(TE_PLAIN.id, "te_eager", TE_PLAIN, got)}


def test_extra_wgrad_gemm_outside_any_log_is_counted_beneath_a_user_module():
    verdicts = _te_waste_of(_planted_impl("planted.extra_wgrad", te_api.EXTERNAL, Linear=ExtraWgradLinear))
    message = verdicts["gemm_work"].message
    assert "layer 1: 2 wgrad GEMMs, 1 required" in message and "layer 3: 2 wgrad GEMMs, 1 required" in message
    assert "FLOPs" in message and "layer 0" not in message and "layer 2" not in message


def test_extra_wgrad_gemm_makes_the_references_log_disagree_with_aten():
    verdicts = _te_waste_of(_planted_impl("planted.extra_wgrad_logged", te_api.REFERENCE, Linear=ExtraWgradLinear))
    assert "layer 1: 2 wgrad GEMMs, 1 required" in verdicts["gemm_work"].message
    assert "wgrad: the log has 2, aten ran 4" in verdicts["gemm_sources_agree"].message
    assert "layer 1 wgrad: the log has 1, aten ran 2" in verdicts["gemm_sources_agree"].message


def test_clean_reference_log_agrees_with_aten():
    verdicts = _te_waste_of(te_api.resolve("reference"))
    assert all(v.ok for v in verdicts.values()), [v.message for v in verdicts.values()]
    assert "gemm_sources_agree" in verdicts


class EarlyWgradLinear(ref_linear.Linear):
    """Fault: with delay_wgrad_compute and fused accumulation, backward() already adds the wgrad into main_grad;
    backward_dw() then adds nothing, so main_grad ends right."""

    def weight_grad_for_autograd(self, wgrad, delay):
        if delay and self.fuse_wgrad_accumulation:
            wg.accumulate_main_grad(self.weight, wgrad())
            self.wgrad_store.append(lambda: torch.zeros_like(self.weight, dtype=torch.float32))
            return wg.returned_wgrad(self.kind, self.weight, None, True, True, self.contract_variant)
        return super().weight_grad_for_autograd(wgrad, delay)


def test_delayed_wgrad_written_to_main_grad_during_backward_is_caught():
    ref = run_microbatches(DELAYED, EagerBackend())
    with te_api.using(te_api.resolve("reference")):
        clean = run_microbatches(DELAYED, TEEagerBackend())
    assert return_contract(DELAYED.id, "te_eager", DELAYED, "linear", ref, clean, tolerance_for(DELAYED)).ok
    with te_api.using(_planted_impl("planted.early_wgrad", te_api.EXTERNAL, Linear=EarlyWgradLinear)):
        got = run_microbatches(DELAYED, TEEagerBackend())
    verdict = return_contract(DELAYED.id, "te_eager", DELAYED, "linear", ref, got, tolerance_for(DELAYED))
    assert not verdict.ok
    assert "0.weight: main_grad changed during backward() of microbatch 1" in verdict.message
    assert "main_grad after 2 microbatches" not in verdict.message  # its final value is right


def test_te_lane_output_and_state_checks_read_microbatch_records():
    ref = run_microbatches(DELAYED, EagerBackend())
    with te_api.using(te_api.resolve("reference")):
        got = run_microbatches(DELAYED, TEEagerBackend())
    tol = tolerance_for(DELAYED)
    assert output_parity(DELAYED.id, "te_eager", ref, got, tol).figures["outputs_compared"] == 2 * DELAYED.iterations
    assert state_left_behind(DELAYED.id, "te_eager", ref, got, tol).ok
    got.outputs[1] = got.outputs[1] * 1.5
    message = output_parity(DELAYED.id, "te_eager", ref, got, tol).message
    assert "forward output (iteration 1, microbatch 2): max abs err" in message
