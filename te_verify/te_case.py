"""Steps every TE family shares: run the case on its backend under the lane's probes, keep what it raised for the
report row, and skip (never pass) a run in which thunder's TE executor claimed no linear; the standard verdicts of
a TE stack case."""
from __future__ import annotations

import dataclasses
from typing import Callable

import pytest

from te_verify import te_api
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend, skip_unsupported
from te_verify.caserun import CaseRun
from te_verify.checks.ending import ending
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.checks.state import output_parity, state_left_behind
from te_verify.checks.te_claims import unclaimed_reason
from te_verify.checks.te_waste import te_waste
from te_verify.checks.tolerances import tolerance_for
from te_verify.checks.verdict import Verdict
from te_verify.probes import default_probes
from te_verify.record import Record
from te_verify.spec import CaseSpec
from te_verify.reference.microbatch import run_mean_reduced
from te_verify.tecpu.strict import Unemulated


def error_figures(record: Record) -> dict:
    """The class, message and pass of what a run raised (the report row keeps them, e.g. TE 990's second backward)."""
    if record.error is None:
        return {}
    message = str(record.error).splitlines()[0][:300] if str(record.error) else ""
    return {"error_class": type(record.error).__name__, "error_message": message, "error_pass": record.error_pass}


REFERENCE_KINDS = {"ops_linear": "linear", "ops_grouped_linear": "grouped_linear"}


def output_reference(spec: CaseSpec, runner: Callable = run_mean_reduced) -> Record:
    """What forward outputs are held to: fp32 eager, or for FP8 cases eager on FP8-rounded operands, as TE's own
    tests build their references (FP8's elementwise error scales with a dot product's terms, not its result). The
    quantized-operand forward is te_verify.reference's (same saturating cast, TE's scale rules, delayed scaling's
    history), on the module kind with the same numerics."""
    if spec.te is None or spec.te.recipe is None:
        return runner(spec, EagerBackend())
    kind = REFERENCE_KINDS.get(spec.te.module, spec.te.module)
    with te_api.using(te_api.resolve("reference")):
        return runner(spec.replace(te=dataclasses.replace(spec.te, module=kind)), TEEagerBackend())


def run_te(case: CaseRun, runner: Callable = run_mean_reduced) -> Record:
    """The case's run under the default probes; its figures and error go to the row; unclaimed runs skip; a run
    that reached something the tex emulation does not emulate errors with that message (never passes)."""
    skip_unsupported(case)
    got = runner(case.spec, case.backend, default_probes(case.backend_name))
    if isinstance(got.error, Unemulated):
        raise got.error
    case.figures.update(got.figures)
    case.figures.update(error_figures(got))
    reason = unclaimed_reason(case.spec, got)
    if reason is not None:
        pytest.skip(reason)
    return got


def verify_te_stack(case: CaseRun) -> list[Verdict]:
    """A TE-lane stack case against eager: outputs (FP8-aware reference), None-ness, gradients, state left
    behind, and the TE lane's waste checks; raises AssertionError with every failure."""
    spec, name = case.spec, case.backend_name
    got = run_te(case)
    ref = run_mean_reduced(spec, EagerBackend())
    tol = tolerance_for(spec, name)
    return case.require([output_parity(spec.id, name, output_reference(spec), got, tol),
                         ending(spec.id, name, ref, got),
                         grad_presence(spec.id, name, ref, got),
                         grad_parity(spec.id, name, ref, got, tol),
                         state_left_behind(spec.id, name, ref, got, tol),
                         *te_waste(spec.id, name, spec, got)])
