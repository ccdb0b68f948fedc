"""A torch-lane case of gradient accumulation (CaseSpec.microbatches; issue 34, item 5): eager and the backend run
the same microbatches in the same order (run.microbatch: interleaved, or every forward first), the backend under
the waste probes and following eager's parameters from the second iteration on; judged as a pair is, against eager
within the bound of the case's fp64 truth (the same microbatches in exact arithmetic)."""
from __future__ import annotations

import dataclasses

import torch

from te_verify.backends.eager import EagerBackend
from te_verify.checks.accumulation import accumulated_work
from te_verify.checks.ending import ending
from te_verify.checks.iterations import each_iteration
from te_verify.checks.leftovers import leftover_verdicts
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.checks.state import output_parity, params_after_steps, state_left_behind
from te_verify.checks.tolerances import tolerance_for, truth_bound
from te_verify.checks.verdict import Verdict
from te_verify.probes import default_probes
from te_verify.run.caserun import CaseRun
from te_verify.run.microbatch import run_microbatches
from te_verify.run.summation_orders import other_order_runs
from te_verify.spec import CaseSpec


class _Fp64Eager(EagerBackend):
    """Eager on the model cast to fp64: the case's truth."""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        return super().prepare(model.double(), spec)


def accumulation_verdicts(spec: CaseSpec, name: str, ref, got, truth, orders: tuple = ()) -> list[Verdict]:
    """ending; outputs; None-ness; the gradients after the first microbatch (grad_parity: each is its own
    forward's) and after the last (grad_accumulation: they add up as eager's), every iteration's; the parameters
    after every optimizer step; what the run left; each microbatch's GEMMs (checks.accumulation) at every iteration
    (checks.iterations)."""
    tol, bound = tolerance_for(spec, name), truth_bound(spec, truth, orders)
    last = dataclasses.replace(grad_parity(spec.id, name, ref, got, tol, -1, bound), check="grad_accumulation")
    return [ending(spec.id, name, ref, got),
            output_parity(spec.id, name, ref, got, tol, bound),
            grad_presence(spec.id, name, ref, got),
            grad_parity(spec.id, name, ref, got, tol, 0, bound), last,
            params_after_steps(spec.id, name, ref, got, tol, bound),
            state_left_behind(spec.id, name, ref, got, tol),
            *leftover_verdicts(spec.id, name, ref, got, second_step=False),
            *each_iteration(spec, (got,), lambda at, runs: [accumulated_work(at, runs[0], name)])]


def verify_accumulation(case: CaseRun) -> list[Verdict]:
    """Run the case's microbatches on eager, the backend (probed) and the fp64 truth; require the verdicts."""
    spec, name = case.spec, case.backend_name
    ref = run_microbatches(spec, EagerBackend())
    got = run_microbatches(spec, case.backend, default_probes(name), follow=ref)
    case.figures.update(got.figures)
    truth = run_microbatches(spec, _Fp64Eager(), dtype=torch.float64, follow=ref)
    orders = other_order_runs(spec, lambda sums: run_microbatches(spec, sums, follow=ref))
    return case.require(accumulation_verdicts(spec, name, ref, got, truth, orders))
