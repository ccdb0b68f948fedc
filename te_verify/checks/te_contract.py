"""The weight-gradient return contract (te_verify.te.reference.contract) checked on microbatch records.

For every trainable weight: backward's return, inferred from .grad, is the table's (wgrad / None / dummy);
with main_grad the gradient lands there exactly once per microbatch (compared with the eager sum over the
microbatches) and nothing else accumulates it twice, and with delay_wgrad_compute backward() leaves it untouched
(backward_dw() writes it); where the table says None, autograd never wrote .grad.
"""
from __future__ import annotations

import torch

from te_verify.checks.parity import compare_tensor
from te_verify.checks.tolerances import Tolerance
from te_verify.checks.verdict import Verdict
from te_verify.record import Record
from te_verify.te.reference import contract
from te_verify.spec import CaseSpec


def _accumulation_ratio(got: torch.Tensor, want: torch.Tensor) -> float:
    """<got, want> / <want, want>: 1.0 = accumulated once per microbatch, 2.0 = twice."""
    denom = float((want.double() * want.double()).sum())
    return float((got.double() * want.double()).sum()) / denom if denom else float("nan")


def _weight_problems(name: str, obs, want_grad: torch.Tensor, expected: str, te, tol: Tolerance) -> list[str]:
    problems = []
    mb = te.microbatches
    wrong = [k + 1 for k, kind in enumerate(obs.grad_kinds) if kind != expected]
    if wrong:
        got = obs.grad_kinds[wrong[0] - 1]
        extra = "; the gradient is accumulated twice (main_grad and .grad)" if te.main_grad and got == "wgrad" else ""
        problems.append(f"{name}: backward returned {got} after microbatch {wrong[0]}, contract says {expected}{extra}")
    if expected == "none" and obs.accumulations:
        problems.append(f"{name}: autograd accumulated into .grad {obs.accumulations} time(s), contract returns None (0)")
    if te.main_grad:
        if obs.main_grad is None:
            problems.append(f"{name}: no main_grad after {mb} microbatches")
        else:
            msg = compare_tensor(f"{name}: main_grad after {mb} microbatches", want_grad, obs.main_grad, tol)
            if msg:
                problems.append(f"{msg} (accumulation ratio {_accumulation_ratio(obs.main_grad, want_grad):.2f}, 1.00 = once per microbatch)")
        if te.delay_wgrad and obs.main_grad_before_dw:
            problems.append(f"{name}: main_grad changed during backward() of microbatch {obs.main_grad_before_dw[0]}; "
                            f"with delay_wgrad_compute it is untouched until backward_dw()")
        if te.grad_added_to_main_grad and obs.grad_added is not True:
            problems.append(f"{name}: grad_added_to_main_grad is {obs.grad_added}, expected True")
    return problems


def return_contract(case_id: str, backend: str, spec: CaseSpec, kind: str, ref: Record, got: Record,
                    tol: Tolerance, variant: str = "intended") -> Verdict:
    """`ref`: eager microbatch record (its last grads = the sum over microbatches); `got`: the TE backend's."""
    head = f"[{case_id}] backend {backend}"
    if got.error is not None:
        return Verdict("return_contract", False, f"{head}: raised {type(got.error).__name__}: {got.error}")
    te = spec.te
    config = contract.config_of(te)
    row = contract.row(kind, config, variant)
    want = ref.grads[-1]
    problems = []
    for name, obs in got.observations["te_contract"].items():
        # After backward_dw, a delayed non-fused weight holds its accumulated wgrad in .grad.
        expected = "wgrad" if (te.delay_wgrad and not te.main_grad) else row.returns
        problems += _weight_problems(name, obs, want[name], expected, te, tol)
        if not te.main_grad and got.grads and got.grads[-1].get(name) is not None:
            msg = compare_tensor(f"{name}: .grad after {te.microbatches} microbatches", want[name], got.grads[-1][name], tol)
            if msg:
                problems.append(msg)
    figures = {"contract_row": f"{kind}/{config}: {row.returns} ({row.label})",
               "contract_weights_compared": len(got.observations["te_contract"])}
    if problems:
        return Verdict("return_contract", False, f"{head}: " + "; ".join(problems), figures, tuple(problems))
    return Verdict("return_contract", True, figures=figures)
