"""Steps every TE family shares: run the case on its backend under the lane's probes, keep what it raised for the
report row, and skip (never pass) a run in which thunder's TE executor claimed no linear; the standard verdicts of
a TE stack case."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator

import pytest
import torch

from te_verify.te import api as te_api
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend, skip_unsupported
from te_verify.run.caserun import CaseRun
from te_verify.checks.ending import ending
from te_verify.checks.fp8_scaling import fp8_scaling
from te_verify.checks.fp8_tolerance import fp8_bound
from te_verify.checks.leftovers import leftover_verdicts
from te_verify.checks.nvfp4_sr import nvfp4_stochastic_rounding, rounding_choices
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.checks.replay import replay_semantics
from te_verify.checks.state import output_parity, params_after_steps, state_left_behind
from te_verify.checks.systematic import grad_scale, resolution
from te_verify.checks.te_claims import unclaimed_reason
from te_verify.checks.te_compile import te_compile_verdicts
from te_verify.models import new_state_bytes
from te_verify.oracle.required import sites, te_sites
from te_verify.checks.te_accumulation import FP8_SAVED, microbatch_waste
from te_verify.checks.te_waste import te_waste
from te_verify.checks.iterations import each_iteration
from te_verify.checks.tolerances import Tolerance, TruthBound, tolerance_for, truth_bound
from te_verify.checks.verdict import Verdict
from te_verify.probes import default_probes
from te_verify.probes.fp8_scaling import scaling_observer
from te_verify.probes.nvfp4_sr import stochastic_rounding_observer
from te_verify.record import Record
from te_verify.spec import TE_RECOMPUTE_MODES, CaseSpec
from te_verify.te.reference import block_recipe, functional, gemm_log
from te_verify.te.reference.sr_replay import RoundingReplay
from te_verify.run.microbatch import run_mean_reduced
from te_verify.te.tecpu.strict import Unemulated


def error_figures(record: Record) -> dict:
    """The class, message and pass of what a run raised (the report row keeps them, e.g. TE 990's second backward)."""
    if record.error is None:
        return {}
    message = str(record.error).splitlines()[0][:300] if str(record.error) else ""
    return {"error_class": type(record.error).__name__, "error_message": message, "error_pass": record.error_pass}


REFERENCE_KINDS = {"ops_linear": "linear", "ops_grouped_linear": "grouped_linear"}
QUANTIZED_REFERENCE = "te_verify.te.reference on the same FP8 operands"
# Recipes that round gradients stochastically -> the same recipe rounding them to nearest.
STOCHASTIC_RECIPES = {"nvfp4": "nvfp4_rn"}


def reference_spec(spec: CaseSpec, replay: RoundingReplay | None = None) -> CaseSpec:
    """`spec` on the reference's module kind with the same numerics; a stochastically rounding recipe without a
    `replay` of a run's choices rounds to nearest instead (the reference a run follows before there is a run)."""
    recipe = spec.te.recipe if replay is not None else STOCHASTIC_RECIPES.get(spec.te.recipe, spec.te.recipe)
    # TE's checkpoint changes no value (its recompute restores the forward's FP8 scales): the reference, which has
    # none, runs the blocks without recompute; the run's values are judged against it all the same.
    recompute = "none" if spec.recompute in TE_RECOMPUTE_MODES else spec.recompute
    return spec.replace(te=dataclasses.replace(spec.te, recipe=recipe,
                                               module=REFERENCE_KINDS.get(spec.te.module, spec.te.module)),
                        recompute=recompute)


def replaying(replay: RoundingReplay | None):
    """Inside, the reference rounds stochastic copies as `replay` says (nothing without one)."""
    return block_recipe.replaying(replay) if replay is not None else contextlib.nullcontext()


def run_replay(spec: CaseSpec, got: Record) -> RoundingReplay | None:
    """For a stochastically rounding recipe, the run's choices for the reference to round by
    (te.reference.sr_replay)."""
    return RoundingReplay(rounding_choices(got)) if spec.te.recipe in STOCHASTIC_RECIPES else None


def runs_te_ops(spec: CaseSpec, backend: object) -> bool:
    """Whether the backend's linears are te.ops' (the ops module kinds, or a backend declaring `te_ops_linears`, as
    thunder's TE executor calling BasicLinear's functional forward and backward): their FP8 GEMMs add an fp32 bias
    as it is."""
    return spec.te.module.startswith("ops_") or getattr(backend, "te_ops_linears", False)


@contextlib.contextmanager
def _reference_numerics(spec: CaseSpec, backend: object) -> Iterator[None]:
    """te_verify.te.reference serving the TE API, with the bias epilogue of the construct `backend` runs."""
    ops = functional.ops_bias_epilogue() if runs_te_ops(spec, backend) else contextlib.nullcontext()
    with te_api.using(te_api.quantized_reference()), ops:
        yield


def output_reference(spec: CaseSpec, runner: Callable = run_mean_reduced, backend: object = None,
                     extra_sites: tuple[str, ...] = (), follow: Record | None = None,
                     replay: RoundingReplay | None = None) -> Record:
    """What forward outputs are held to: fp32 eager, or for FP8 cases eager on FP8-rounded operands, as TE's own
    tests build their references (FP8's elementwise error scales with a dot product's terms, not its result). The
    quantized-operand forward is te_verify.te.reference's (same saturating cast, TE's scale rules, delayed scaling's
    history), on the module kind with the same numerics as `backend`'s; its backward quantizes the same operands as
    TE's (the gradient E4M3 or E5M2 per the recipe, with the saved FP8 input and weight copies). `extra_sites`:
    linears quantized besides the case's TE sites (beyond_reference); `follow`: the record whose parameters each
    later iteration starts from (runner.Trainer); `replay`: a run's stochastic rounding, which the reference rounds
    by (without it such a recipe's gradients round to nearest: the record a run follows)."""
    if spec.te is None or spec.te.recipe is None:
        return runner(spec, EagerBackend())
    with _reference_numerics(spec, backend), replaying(replay):
        record = runner(reference_spec(spec, replay), TEEagerBackend(extra_sites), follow=follow)
    record.backend = QUANTIZED_REFERENCE
    return record


class _Fp64TEBackend(TEEagerBackend):
    """The TE lane's modules on the model cast to fp64: the quantized truth's run."""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        return super().prepare(model.double(), spec)


class _Fp64EagerBackend(EagerBackend):
    """Eager on the model cast to fp64: a high-precision TE case's truth."""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        return super().prepare(model.double(), spec)


def high_precision_bound(spec: CaseSpec, eager: Record, runner: Callable = run_mean_reduced) -> TruthBound:
    """What a high-precision TE stack case's outputs and gradients are held to, as the torch lane's
    (checks.tolerances.truth_bound): their normwise distance from the case's fp64 truth (eager on the same weights,
    input and cotangent in fp64, run by `runner` as `eager` was, following `eager`'s parameters from the second
    iteration on) within TRUTH_FACTOR of eager's, never under the floor."""
    return truth_bound(spec, runner(spec, _Fp64EagerBackend(), dtype=torch.float64, follow=eager))


def bf16_resolution(spec: CaseSpec, name: str, ref: Record, got: Record, scale: Verdict) -> list[Verdict]:
    """grad_scale_resolution (checks.systematic) where the case is sized to resolve a 1% lean: high precision in bf16
    (matrix.te's bf16 draws), a gradient to fit and a backward pass the backend completed (one that raised first is
    `ending`'s); `scale` is the case's grad_scale verdict."""
    trains = any(g is not None for grads in ref.grads for g in grads.values()) and bool(got.grads)
    return [resolution(spec.id, name, scale)] if spec.dtype == "bf16" and spec.te.recipe is None and trains else []


def quantized_truth(spec: CaseSpec, backend: object = None, runner: Callable = run_mean_reduced,
                    follow: Record | None = None, extra_sites: tuple[str, ...] = (),
                    replay: RoundingReplay | None = None) -> Record:
    """output_reference's FP8 run in exact arithmetic: model, input, cotangent and every GEMM in fp64, the operands
    quantized at the same places (the TE sites and `extra_sites`) by the same rules. FP8 gradients are bounded by
    their distance from it (checks.fp8_tolerance): accumulation noise, not quantization noise."""
    with _reference_numerics(spec, backend), gemm_log.accumulating(torch.float64), replaying(replay):
        return runner(reference_spec(spec, replay), _Fp64TEBackend(extra_sites), dtype=torch.float64, follow=follow)


def beyond_reference(spec: CaseSpec, got: Record) -> list[str]:
    """Linears the run quantized (measured at the tex boundary, probes.tex_gemm) that are no TE site of the case:
    thunder's TE executor claims every linear whose shapes FP8 accepts, in a LoRA model also those the model keeps as
    torch Linears (its TE sites are the adapters' bases)."""
    claimed = got.figures.get("te_layers_claimed")
    if spec.model is None or claimed is None:
        return []
    return sorted(set(claimed) - set(te_sites(spec)))


def fp8_judged_against(case: CaseRun, got: Record, quantized: Record,
                       runner: Callable = run_mean_reduced) -> tuple[Record, Tolerance, TruthBound]:
    """What an FP8 case's outputs, gradients and parameters are held to: the same-quantization reference (the same
    operands quantized with the same scales) within its fp64 truth's bound (checks.fp8_tolerance), not FP8's
    quantization tolerance. That is `quantized` (output_reference's record for the case's backend, which the run
    followed), or where the run quantized linears beyond the case's TE sites (beyond_reference), the reference with
    those quantized too, following `quantized` as the run did: delayed scaling clips values from the second
    iteration on, so no reference running them in high precision can judge it. A recipe rounding gradients
    stochastically: both rerun, rounding as the run did (te.reference.sr_replay; the choices held to stochastic
    rounding's contract by checks.nvfp4_sr), following `quantized` (which rounded them to nearest)."""
    spec = case.spec
    tol = tolerance_for(spec, case.backend_name)
    beyond = tuple(beyond_reference(spec, got))
    ref = quantized
    if beyond:
        case.figures["fp8_grad_reference"] = (f"the same-quantization reference with {list(beyond)} quantized too: "
                                              f"the run quantized them beyond the case's TE sites")
    if spec.te.recipe in STOCHASTIC_RECIPES:
        case.figures["fp8_grad_reference_rounding"] = ("the run's stochastic rounding choices replayed "
                                                       "(te.reference.sr_replay)")
    if beyond or spec.te.recipe in STOCHASTIC_RECIPES:
        ref = output_reference(spec, runner, case.backend, beyond, follow=quantized, replay=run_replay(spec, got))
    truth = quantized_truth(spec, case.backend, runner, follow=quantized, extra_sites=beyond,
                            replay=run_replay(spec, got))
    return ref, tol, fp8_bound(spec, truth)


def fp8_value_verdicts(case: CaseRun, got: Record, quantized: Record, runner: Callable = run_mean_reduced,
                       outputs: bool = True) -> list[Verdict]:
    """An FP8 case's outputs (unless `outputs` is False: the family judges them itself) within the recipe's
    tolerance, gradients after every backward pass (replay) and every iteration (grad_parity, and grad_scale against
    the same truth, the quantized reference in eager's role: checks.systematic), and parameters after every optimizer
    step, against fp8_judged_against's reference and bound (its fp64 truth computed once): the same-quantization
    reference, not TE's dtype table."""
    ref, tol, bound = fp8_judged_against(case, got, quantized, runner)
    spec, name = case.spec, case.backend_name
    judged = [output_parity(spec.id, name, ref, got, tol)] if outputs else []
    verdicts = [*judged, replay_semantics(spec.id, name, ref, got, tol, bound),
                grad_parity(spec.id, name, ref, got, tol, bound=bound), grad_scale(spec.id, name, ref, got, bound),
                params_after_steps(spec.id, name, ref, got, tol, bound)]
    beyond = beyond_reference(spec, got)
    note = f" (the reference quantized {beyond} as the run did, beyond the case's TE sites)" if beyond else ""
    return [v if v.ok or not note else dataclasses.replace(v, message=v.message + note) for v in verdicts]


def te_probes(case: CaseRun) -> list:
    """The TE lane's probes; for an FP8 case over TE's Python also the scaling observer of every iteration, and under
    a recipe rounding gradients stochastically the observer of its NVFP4 quantizations (probes.nvfp4_sr)."""
    probes = default_probes(case.backend_name, bool(case.spec.autocast))  # autocast: GEMMs read aten casts
    if not te_api.active().runs_te_python:
        return probes
    observers = (scaling_observer(case.spec), stochastic_rounding_observer(case.spec))
    return probes + [o for o in observers if o is not None]


def scaling_verdicts(case: CaseRun, got: Record) -> list[Verdict]:
    """fp8_scaling (checks.fp8_scaling) for an FP8 case over TE's Python; none in high precision, and none for a
    pure-PyTorch --te-impl, whose quantizations never reach a tex boundary (the row says so). A block-scaled recipe's
    scales are not observed by it (per-tensor scaling state only; the row says so): they enter the gradients, which
    the same-quantization reference, scaling each block by the format's own rule, judges; a recipe rounding gradients
    stochastically gets nvfp4_stochastic_rounding instead (stochastic_verdicts)."""
    spec = case.spec
    if spec.te is None or spec.te.recipe is None:
        return []
    if spec.te.recipe in te_api.BLOCK_RECIPES:
        case.figures["fp8_scaling"] = (f"not observed: {spec.te.recipe}'s block scales are no per-tensor scaling state; "
                                       f"the same-quantization reference's gradients scale each block by the format's "
                                       f"rule (te.reference.block)")
        return stochastic_verdicts(case, got)
    if not te_api.active().runs_te_python:
        case.figures["fp8_scaling"] = f"not applicable: --te-impl {te_api.active().name} has no tex boundary"
        return []
    return [fp8_scaling(spec.id, case.backend_name, spec, got)]


def stochastic_verdicts(case: CaseRun, got: Record) -> list[Verdict]:
    """nvfp4_stochastic_rounding (checks.nvfp4_sr) for a recipe rounding gradients stochastically over TE's Python."""
    if case.spec.te.recipe not in STOCHASTIC_RECIPES or not te_api.active().runs_te_python:
        return []
    gradient_gemms = any(role in ("dgrad", "wgrad") for site in sites(case.spec) for role in site.roles())
    return [nvfp4_stochastic_rounding(case.spec.id, case.backend_name, got, gradient_gemms)]


def microbatch_waste_verdicts(case: CaseRun, got: Record) -> list[Verdict]:
    """A microbatch family's waste at every iteration (checks.te_accumulation); an FP8 case's row says why its saved
    bytes are not judged."""
    spec, name = case.spec, case.backend_name
    if spec.te.recipe is not None:
        case.figures["te_saved_bytes"] = FP8_SAVED
    return each_iteration(spec, (got,), lambda at, runs: microbatch_waste(spec.id, name, at, *runs))


def run_te(case: CaseRun, runner: Callable = run_mean_reduced, follow: Record | None = None) -> Record:
    """The case's run under the default probes, following `follow` (the record it is judged against) from the second
    iteration on; its figures and error go to the row; unclaimed runs skip; a run that reached something the tex
    emulation does not emulate errors with that message (never passes)."""
    skip_unsupported(case)
    got = runner(case.spec, case.backend, te_probes(case), follow=follow)
    if isinstance(got.error, Unemulated):
        raise got.error
    case.figures.update(got.figures)
    case.figures.update(error_figures(got))
    reason = unclaimed_reason(case.spec, got)
    if reason is not None:
        pytest.skip(reason)
    return got


def verify_te_stack(case: CaseRun) -> list[Verdict]:
    """A TE-lane stack case against eager: outputs and FP8 gradients against the reference on the same FP8 operands,
    None-ness, gradients, state left behind, what the step leaves besides values (checks.leftovers), and the TE
    lane's waste checks at every iteration (checks.iterations); raises AssertionError with every failure."""
    spec, name = case.spec, case.backend_name
    skip_unsupported(case)
    ref = run_mean_reduced(spec, EagerBackend())
    tol = tolerance_for(spec, name)
    outputs_ref = output_reference(spec, backend=case.backend) if spec.te.recipe is not None else ref
    got = run_te(case, follow=outputs_ref)
    bound = high_precision_bound(spec, ref) if spec.te.recipe is None else None
    scale = grad_scale(spec.id, name, ref, got, bound) if bound is not None else None
    values = (fp8_value_verdicts(case, got, outputs_ref) if spec.te.recipe is not None
              else [output_parity(spec.id, name, ref, got, tol, bound),
                    grad_parity(spec.id, name, ref, got, tol, bound=bound), scale,
                    *bf16_resolution(spec, name, ref, got, scale),
                    params_after_steps(spec.id, name, ref, got, tol, bound)])
    return case.require([ending(spec.id, name, ref, got),
                         grad_presence(spec.id, name, ref, got),
                         *values,
                         *scaling_verdicts(case, got),
                         state_left_behind(spec.id, name, ref, got, tol),
                         *leftover_verdicts(spec.id, name, ref, got, allowed=new_state_bytes(spec, 2)),
                         *each_iteration(spec, (got,), lambda at, runs: te_waste(spec.id, name, at, *runs)),
                         *te_compile_verdicts(case, got)])
