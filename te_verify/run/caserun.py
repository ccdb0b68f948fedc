"""One case on one backend inside a test: run it, apply the standard checks, keep figures for the row."""
from __future__ import annotations

from typing import Iterable

from te_verify.backends.base import Backend
from te_verify.backends.eager import EagerBackend
from te_verify.checks.ending import ending
from te_verify.checks.family_waste import family_waste_verdicts
from te_verify.checks.iterations import each_iteration
from te_verify.checks.leftovers import leftover_verdicts
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.checks.replay import replay_semantics
from te_verify.checks.state import output_parity, params_after_steps, state_left_behind
from te_verify.checks.systematic import grad_scale
from te_verify.checks.tolerances import Tolerance, TruthBound, derived_tolerance, tolerance_for, truth_bound
from te_verify.checks.verdict import CheckFailures, Verdict, failed_messages
from te_verify.checks.waste import waste_verdicts
from te_verify.models import new_state_bytes
from te_verify.probes import default_probes
from te_verify.probes.base import Probe
from te_verify.record import Record
from te_verify.run.runner import run_case, run_fp64_eager
from te_verify.run.summation_orders import other_order_runs
from te_verify.spec import CaseSpec


class CaseRun:
    """The `case` fixture's value: a spec, the backend under test, and the figures for its report row."""

    def __init__(self, spec: CaseSpec, backend_name: str, backend: Backend | None,
                 selection: dict | None = None) -> None:
        self.spec = spec
        self.backend_name = backend_name
        self.backend = backend
        # For a pr-tier case: what the choice of its family x backend kept (te_verify.matrix.selection); None otherwise.
        self.selection = selection
        self.figures: dict = {}
        # Every verdict the case's checks returned (require appends): the plugin judges known gaps from them.
        self.verdicts: list[Verdict] = []

    def __repr__(self) -> str:
        return f"CaseRun({self.backend_name}, {self.spec.id})"

    def run(self, backend: Backend | None = None, probes: Iterable[Probe] = (), spec: CaseSpec | None = None,
            follow: Record | None = None) -> Record:
        """Run a spec (default: this case's) on a backend (default: the one under test), preparing it once, following
        `follow` from the second iteration on (runner.Trainer)."""
        return run_case(spec or self.spec, backend or self.backend, probes, follow=follow)

    def standard_verdicts(self, ref: Record, got: Record, tol: Tolerance | None = None,
                          bound: TruthBound | None = None) -> list[Verdict]:
        tol = tol or tolerance_for(self.spec, self.backend_name)
        case_id, name = self.spec.id, self.backend_name
        return [
            ending(case_id, name, ref, got),
            replay_semantics(case_id, name, ref, got, tol, bound),
            output_parity(case_id, name, ref, got, tol, bound),
            grad_presence(case_id, name, ref, got),
            grad_parity(case_id, name, ref, got, tol, bound=bound),
            params_after_steps(case_id, name, ref, got, tol, bound),
            state_left_behind(case_id, name, ref, got, tol),
            *leftover_verdicts(case_id, name, ref, got, allowed=new_state_bytes(self.spec, 2)),
        ]

    def verify(self) -> list[Verdict]:
        """Eager reference vs the backend under test: replay semantics, None-ness, gradient parity, and the
        waste checks (FLOPs and GEMMs by role, saved-for-backward bytes, peak) against the oracle, at every iteration
        (checks.iterations)."""
        family = self.spec.model is not None  # its checks judge what is not a linear site against eager's run
        ref = run_case(self.spec, EagerBackend(), default_probes("eager", True) if family else ())
        if ref.error is not None and ref.error_pass == 0:  # the harness could not build or prepare the case
            raise RuntimeError(f"{self.spec.id}: the eager reference raised before the measured forward: "
                               f"{type(ref.error).__name__}: {ref.error}") from ref.error
        # Copies are followed where GEMMs read casts of the weights and inputs (model families, autocast), and where
        # backward recomputes forwards: a recomputed fprop over a weight's copy is told from a dgrad by the copy's axes.
        follow_copies = family or bool(self.spec.autocast) or self.spec.recompute != "none"
        got = self.run(probes=default_probes(self.backend_name, follow_copies), follow=ref)
        if getattr(self.backend, "allocates_outside_dispatch", False) and got.figures.get("peak_source") == \
                "storage_tracker":
            got.figures["peak_blind"] = f"{self.backend_name} allocates outside the dispatcher, which the storage tracker reads"
        self.figures.update(got.figures)
        truth = run_fp64_eager(self.spec, follow=ref)
        if family:  # attention and norms: eager's elementwise deviation from fp64, doubled (see tolerances.py)
            tol, bound = derived_tolerance(self.spec, ref, truth), None
            waste = each_iteration(self.spec, (got, ref),
                                   lambda spec, runs: family_waste_verdicts(spec, *runs, self.backend_name))
        else:  # a stack's every value against its fp64 truth, normwise
            orders = other_order_runs(self.spec, lambda sums: run_case(self.spec, sums, follow=ref))
            tol, bound = None, truth_bound(self.spec, truth, orders)
            waste = each_iteration(self.spec, (got,), lambda spec, runs: waste_verdicts(spec, *runs, self.backend_name))
        self.figures["tolerance"] = (bound or tol).source
        scale = grad_scale(self.spec.id, self.backend_name, ref, got, bound or truth_bound(self.spec, truth))
        return self.require(self.standard_verdicts(ref, got, tol, bound) + [scale] + waste)

    def require(self, verdicts: list[Verdict]) -> list[Verdict]:
        """Record the verdicts and their figures; raise CheckFailures (every verdict, every failure message) when
        one failed."""
        self.verdicts += verdicts
        for verdict in verdicts:
            self.figures.update(verdict.figures)
        if failed_messages(verdicts):
            raise CheckFailures(self.verdicts)
        return verdicts
