"""Caller side of a distributed case: run it on the pool, build records, apply the distributed checks."""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Callable

import torch

from te_verify.backends.eager import EagerBackend
from te_verify.checks.collectives import ParamInfo, frozen_collectives, gradient_volume
from te_verify.checks.dist_parity import (dist_grad_parity, dist_output_parity, dist_schedule_parity,
                                          dist_state_left_behind)
from te_verify.checks.reshard import LayerInfo, gathered_peak, reshard_timing
from te_verify.checks.family_waste import family_saved_verdict, outside_sites
from te_verify.checks.iterations import each_iteration
from te_verify.checks.leftovers import grad_meta, inputs_left, memory_retained, output_meta, requires_grad_left
from te_verify.checks.tolerances import Tolerance, derived_tolerance, tolerance_for, truth_bound
from te_verify.checks.verdict import Verdict, not_observed, waste_ratio
from te_verify.checks.waste import flops_verdict, saved_verdict, site_name
from te_verify.compat import record
from te_verify.distributed.declare import REGISTERED
from te_verify.distributed.rank.case_runner import DistCase, RankOutcome, run_dist_case
from te_verify.checks.training import engine_state, params_after_steps
from te_verify.distributed.engines import engine
from te_verify.distributed.policy import has_policy
from te_verify.models.recompute import torch_equivalent
from te_verify.distributed.precision import (gathered_layers, policy_collectives, policy_schedule_truth,
                                            policy_trajectories, policy_truth, reference_spec, rounded_start, start_of)
from te_verify.distributed.wrappers.fairscale import STEP as FAIRSCALE_STEP
from te_verify.distributed.rank.training import microbatches
from te_verify.distributed.schedule import reference_iterations
from te_verify.training import StateBytes
from te_verify.distributed.pool.pool import PoolResult, RankPool
from te_verify.distributed.types import units_of
from te_verify.models import CPU, build_model, frozen_at_backward, masks_at
from te_verify.oracle.recompute import recomputed_sites
from te_verify.oracle.required import (BYTES_PER_ELEMENT, backward_gemms, forward_gemms, graph_exists, input_needs_grad,
                                      required_flops, sites, trainable_masks)
from te_verify.probes import default_probes
from te_verify.record import INPUT_GRAD, Record
from te_verify.run.runner import run_case, run_fp64_eager
from te_verify.spec import CaseSpec

RESHARD_DEFAULTS = {"fsdp2": True, "fairscale_fsdp": True, "thunder_fsdp": True}


def shards(spec: CaseSpec) -> bool:
    """Whether the case's wrapper shards parameters (a user's wrapper: as it declares; an engine: as its file says)."""
    declared, trainer = REGISTERED.get(spec.dist.wrapper), engine(spec.dist.wrapper)
    if trainer is not None:
        return trainer.shards(spec)
    return declared.shards if declared is not None else spec.dist.wrapper in SHARDED


def reshards_after_forward(spec: CaseSpec) -> bool:
    declared, trainer = REGISTERED.get(spec.dist.wrapper), engine(spec.dist.wrapper)
    if trainer is not None:
        return trainer.reshards_after_forward(spec)
    if declared is not None:
        return declared.reshards_after_forward
    opts = dict(spec.dist.options)
    if spec.dist.wrapper == "fsdp":
        return opts.get("sharding", "FULL_SHARD") == "FULL_SHARD"
    if spec.dist.wrapper == "thunder_fsdp":
        return opts.get("sharding_strategy", "ZERO3") == "ZERO3"
    return bool(opts.get("reshard_after_forward", RESHARD_DEFAULTS.get(spec.dist.wrapper, False)))


def param_infos(spec: CaseSpec) -> list[ParamInfo]:
    """Every parameter with its trainability at backward: a stack's from its masks, a model family's from the
    family's freezing rule (by qualified name: LoRA's base weights frozen, adapters and norms trainable)."""
    if spec.model is not None:
        model = frozen_at_backward(spec, CPU)
        unit_of = {id(p): u for u, unit in enumerate(units_of(model, spec)) for p in unit.parameters()}
        return [ParamInfo(name, tuple(p.shape), p.element_size(), p.requires_grad, unit_of.get(id(p)))
                for name, p in model.named_parameters()]
    weights, biases = trainable_masks(spec)
    out = []
    for k, layer in enumerate(build_model(spec)):
        for name, p in layer.named_parameters(recurse=False):
            trainable = weights[k] if name == "weight" else biases[k]
            out.append(ParamInfo(f"{k}.{name}", tuple(p.shape), p.element_size(), trainable, k))
    return out


def layer_infos(spec: CaseSpec, params: list[ParamInfo]) -> list[LayerInfo]:
    """Per unit the wrapper wraps: its bytes, whether it trains, whether its input needs a gradient. A family's
    units are its blocks, run in sequence: a block's input needs grad iff the model input does or an earlier
    block trains."""
    if spec.model is not None:
        infos, upstream = [], spec.input_requires_grad
        for unit in units_of(frozen_at_backward(spec, CPU), spec):
            ps = list(unit.parameters())
            trains = any(p.requires_grad for p in ps)
            infos.append(LayerInfo(sum(p.numel() * p.element_size() for p in ps), trains, upstream,
                                   numels=tuple(p.numel() for p in ps)))
            upstream = upstream or trains
        return infos
    weights, biases = trainable_masks(spec)
    by_layer = [[p for p in params if p.name.split(".")[0] == str(k)] for k in range(spec.n_layers)]
    recomputed = {s.layer for s in recomputed_sites(spec, sites(spec))}  # their forward runs in backward again
    return [LayerInfo(sum(p.nbytes for p in by_layer[k]), weights[k] or biases[k], needs, k in recomputed,
                      tuple(math.prod(p.shape) for p in by_layer[k]))
            for k, needs in enumerate(input_needs_grad(spec))]


def rank_records(backend: str, result: PoolResult) -> list[Record]:
    records = []
    for rank, outcome in enumerate(result.results):
        record = Record(backend=f"{backend}[rank {rank}]")
        if rank in result.errors:
            record.error, record.error_pass = RuntimeError(result.errors[rank]), 0
        else:
            record.grads.append({**outcome.grads, INPUT_GRAD: outcome.input_grad})
            record.outputs.append(outcome.output)
            record.state_after = {**{f"param:{name}": value for name, value in outcome.params.items()},
                                  **{f"buffer:{name}": value for name, value in outcome.buffers.items()}}
            record.figures, record.observations = outcome.figures, outcome.observations
            record.later = outcome.later
            record.requires_grad_after = outcome.requires_grad_after
            record.inputs_before, record.inputs_after = outcome.inputs_before, outcome.inputs_after
        records.append(record)
    return records


def local_spec(spec: CaseSpec) -> CaseSpec:
    """What one rank runs: the spec on its shard of the batch (the oracle's figures per rank), single-process (a
    shard need not split over the ranks again); an engine's first microbatch of it, which its probes watch. An
    engine's own checkpoint is torch's of the same reentrancy there (models.recompute.torch_equivalent)."""
    rows = spec.batch_shape[0] // spec.dist.world_size // microbatches(spec)
    return reference_spec(spec).replace(batch_shape=(rows, *spec.batch_shape[1:]), dist=None,
                                        recompute=torch_equivalent(spec.recompute))


def gathered_weight_allowance(spec: CaseSpec) -> int:
    """Saved bytes a wrapper that keeps parameters gathered between forward and backward (ZeRO-2) may hold as
    plain tensors: the weights whose dgrad backward needs. Nothing for one that reshards after forward, nor for one
    that never shards (DDP's saved weights are the Parameters, which never count: an allowance there hid a frozen
    layer's saved input)."""
    if not shards(spec) or reshards_after_forward(spec):
        return 0
    return sum(spec.widths[k] * spec.widths[k + 1] * BYTES_PER_ELEMENT[spec.dtype]
               for k, needs in enumerate(input_needs_grad(spec)) if needs)


def rank_waste(spec: CaseSpec, ranks: list[Record]) -> list[Verdict]:
    """Each rank's GEMMs, FLOPs and saved bytes against the oracle of its shard (checks.waste), at every iteration it
    ran probed (checks.iterations: each against what trains in it), merged over the ranks per check."""
    done = [(rank, record) for rank, record in enumerate(ranks) if record.error is None and record.grads]
    eager = run_case(local_spec(spec), EagerBackend(), default_probes("eager", True)) \
        if spec.model is not None and done else None
    found = [v for rank, record in done
             for v in each_iteration(spec, (record,), lambda at, runs, rank=rank: _rank_waste(at, rank, runs[0], eager))]
    return [merge_ranks(name, [v for v in found if v.check == name]) for name in ("dist_waste_flops", "dist_waste_saved")]


def _rank_waste(spec: CaseSpec, rank: int, record: Record, eager: Record | None) -> list[Verdict]:
    """One rank's dist_waste_flops and dist_waste_saved over one iteration's probes (`spec`: the case as the oracle
    sees that iteration)."""
    backend, local = spec.dist.wrapper, local_spec(spec)
    label = f"{spec.id} [{backend} rank {rank}, its shard {local.batch_shape}]"
    if spec.model is not None:
        flops, saved = family_rank_waste(spec, local, record, eager, label)
    else:
        flops = flops_verdict(local, record, backend, label)
        saved = saved_verdict(local, record, backend, label, gathered_weight_allowance(spec))
    return [dataclasses.replace(flops, check="dist_waste_flops"), dataclasses.replace(saved, check="dist_waste_saved")]


SHARDED = ("fsdp", "fsdp2", "fairscale_fsdp", "thunder_fsdp")


def family_rank_waste(spec: CaseSpec, local: CaseSpec, record: Record, eager: Record,
                      label: str) -> tuple[Verdict, Verdict]:
    """A model family's rank: the linear sites' GEMMs against the oracle of the shard (te_verify.oracle.graph),
    attention's batched GEMMs outside the rule (counted, not judged), as checks.family_waste does on the torch lane.

    Unsharded wrappers (ddp, thunder_ddp) are judged per site and role. A sharded wrapper's backward multiplies
    freshly gathered copies of the weights, which the probe cannot tie to one site where sites share a shape
    (q/k/v/o; a LoRA A and B beside them) and the rows equal a fan: a dgrad there reads as a wgrad (measured on
    fsdp2, llama1 d32, shard (1, 8)). Those are judged by FLOPs and by GEMMs per pass, which still catch any
    extra GEMM (a frozen base weight's wgrad is one); the per-site attribution is a figure.

    Saved-for-backward: checks.family_waste's per-site-value rule, against `eager`, eager's probed run of the
    rank's shard."""
    events = record.observations.get("gemm_events", [])
    inside = [e for e in events if not outside_sites(e)]
    if shards(spec):
        flops = gemm_count_verdict(local, inside, label)
    else:
        flops = flops_verdict(local, record, spec.dist.wrapper, label, events=inside)
        flops.figures["gemm_roles_judged"] = True
    flops.figures.update(gemms_outside_sites=len(events) - len(inside),
                         flops_outside_sites=sum(e.flops for e in events if outside_sites(e)))
    return flops, family_saved_verdict(local, record, eager, spec.dist.wrapper, label)


def gemm_count_verdict(local: CaseSpec, events: list, label: str) -> Verdict:
    """FLOPs within the oracle's and, per pass, no more site GEMMs than it requires (roles not judged)."""
    actual, required = sum(e.flops for e in events), required_flops(local)
    want = {0: len(forward_gemms(local))}
    want.update({k: len(backward_gemms(local)) if graph_exists(local) else 0 for k in range(1, local.replays + 1)})
    got = Counter(e.pass_index for e in events)
    problems = [f"{'forward' if k == 0 else f'backward pass {k}'}: {got[k]} site GEMMs, {want.get(k, 0)} required"
                for k in sorted(set(got) | set(want)) if got[k] > want.get(k, 0)]
    attributed = Counter((e.layer, e.role) for e in events)
    figures = {"flops_actual": actual, "flops_required": required, "flops_ratio": waste_ratio(actual, required),
               "gemm_roles_judged": False,
               "gemm_attribution": "; ".join(f"{site_name(local, layer) if layer is not None else 'unattributed'} "
                                             f"{role} x{n}" for (layer, role), n in sorted(attributed.items(), key=str))}
    ok = actual <= required and not problems
    message = "" if ok else (f"{label}: FLOPs {actual:,} vs {required:,} required (ratio {figures['flops_ratio']}); "
                             + "; ".join(problems))
    return Verdict("waste_flops", ok, message, figures)


def merge_ranks(name: str, verdicts: list[Verdict]) -> Verdict:
    """One verdict from the ranks' own: failing if any rank's failed; figures of the worst rank last."""
    figures = {k: v for verdict in sorted(verdicts, key=lambda v: v.ok, reverse=True) for k, v in verdict.figures.items()}
    return Verdict(name, all(v.ok for v in verdicts), "\n".join(v.message for v in verdicts if not v.ok), figures)


def rank_peaks(result: PoolResult) -> dict:
    """The highest rank's peak memory, forward+backward and backward (a figure: judged through gathered_peak,
    see docs/checks.md), and the slowest rank's wrap (the wrapper's or engine's own per-case set-up)."""
    done = [o for o in result.results if o is not None]
    return {key: max(o.figures.get(key, 0) for o in done) for key in ("peak_bytes", "peak_backward_bytes", "wrap_s")} \
        if done else {}


def dist_verdicts(spec: CaseSpec, result: PoolResult) -> list[Verdict]:
    """Parity of gradients, outputs and parameters left behind on every rank; every rank's GEMMs, FLOPs and
    saved bytes against its shard's oracle, and what its step left besides values (checks.leftovers: metadata of
    outputs and gradients, requires_grad, its input shard and cotangent, memory a later step retains); every rank's
    collectives of frozen parameters; gradient volume, reshard timing and gathered peak from rank 0's
    observations."""
    backend, ranks = spec.dist.wrapper, rank_records(spec.dist.wrapper, result)
    ref = run_case(reference_spec(spec), EagerBackend())  # under a mixed-precision policy: eager in its precision
    tol, (truth, bound) = dist_tolerance(spec, ref), policy_truth(spec)
    verdicts = [dist_grad_parity(spec.id, backend, ref, ranks, tol, truth, bound),
                dist_output_parity(spec.id, backend, ref, ranks, tol),
                dist_state_left_behind(spec.id, backend, rounded_start(ref, start_of(spec)), ranks, tol)]
    outcome: RankOutcome | None = next((o for o in result.results if o is not None), None)
    if outcome is None or result.errors:
        return verdicts
    verdicts += rank_waste(spec, ranks)
    verdicts += [merge_ranks(name, [check(r) for r in ranks]) for name, check in (
        ("output_meta", lambda r: output_meta(spec.id, r.backend, ref, r)),
        ("grad_meta", lambda r: grad_meta(spec.id, r.backend, ref, r)),
        ("requires_grad_left", lambda r: requires_grad_left(spec.id, r.backend, ref, r)),
        ("inputs_left", lambda r: inputs_left(spec.id, r.backend, r)),
        ("memory_retained", lambda r: memory_retained(spec.id, r.backend, r)))]
    params = param_infos(spec)
    layers = layer_infos(spec, params)
    regathers = reshards_after_forward(spec)
    layout = (outcome.engine_state or {}).get("grad_buffer")
    verdicts.append(volume_per_iteration(spec, outcome.collectives, params, layout))
    sharded = shards(spec)
    verdicts.append(collectives_verdict(spec, {r: o.collectives for r, o in enumerate(result.results)}, sharded,
                                        regathers))
    if has_policy(spec):
        verdicts.append(policy_collectives(spec, {r: o.collectives for r, o in enumerate(result.results)},
                                           lambda k: param_infos(spec_at(spec, k + 1)), sharded))
    verdicts.append(reshard_timing(spec.id, backend, outcome.timeline, layers, sharded))
    verdicts.append(gathered_peak(spec.id, backend, outcome.timeline, gathered_layers(spec, layers), regathers,
                                  sharded))  # in the policy's param dtype: bf16 layers are half the fp32 bytes
    if spec.schedule and not outcome.params_after_steps:  # a wrapper's later iterations (distributed.schedule)
        verdicts.append(dist_schedule_parity(spec.id, backend, reference_iterations(reference_spec(spec)),
                                             {r: (o.scheduled_grads, o.schedule_error)
                                              for r, o in enumerate(result.results)}, tol,
                                             *policy_schedule_truth(spec, bound)))
    if outcome.params_after_steps:  # a training engine's case, built-in or a user's declared wrapper with train=
        verdicts += training_verdicts(spec, result, params, tol)
    return verdicts


def spec_at(spec: CaseSpec, iteration: int) -> CaseSpec:
    """The spec whose first iteration trains what `spec` trains in `iteration` (its freeze schedule's masks then):
    the oracle of that iteration's collectives. `spec` itself without a schedule."""
    if not spec.schedule:
        return spec
    weights, biases = masks_at(spec, iteration)
    return spec.replace(weight_frozen=weights, bias_frozen=biases, freeze_timing="before", schedule=())


def collectives_verdict(spec: CaseSpec, ranks: dict[int, list], sharded: bool, regathers: bool) -> Verdict:
    """frozen_collectives iteration by iteration (an engine's, a wrapper's later steps: distributed.rank.case_runner),
    each against the parameters frozen in it (a freeze schedule's), a failure naming its iteration."""
    iterations = sorted({c.iteration for calls in ranks.values() for c in calls}) or [0]
    verdicts = []
    for k in iterations:
        at = spec_at(spec, k + 1)
        params = param_infos(at)
        verdict = frozen_collectives(spec.id, spec.dist.wrapper,
                                     {r: [c for c in calls if c.iteration == k] for r, calls in ranks.items()},
                                     params, layer_infos(at, params), sharded, regathers, spec.dist.world_size)
        if (k or spec.schedule) and not verdict.ok:
            verdict.message = f"iteration {k + 1}: {verdict.message}"
        verdicts.append(verdict)
    merged = merge_ranks("frozen_collectives", verdicts)
    merged.figures = {key: sum(v.figures[key] for v in verdicts) for key in verdicts[0].figures}  # bytes, calls: all
    merged.figures["frozen_collectives_iterations"] = len(iterations)
    return merged


def volume_per_iteration(spec: CaseSpec, calls: list, params: list[ParamInfo], layout: StateBytes | None) -> Verdict:
    """gradient_volume of each iteration (an engine's case runs several; a wrapper's one, or more under a freeze
    schedule, each against the parameters trainable in it), as one verdict; an engine's grad-buffer padding
    (`layout.slack`) is not waste, and one that keeps only its gradient partition reduces every microbatch
    (Engine.reductions)."""
    iterations = sorted({c.iteration for c in calls} or {0})
    trainer = engine(spec.dist.wrapper)
    verdicts = []
    for k in iterations:
        at = params if not spec.schedule else param_infos(spec_at(spec, k + 1))
        verdict = gradient_volume(spec.id, spec.dist.wrapper, [c for c in calls if c.iteration == k], at,
                                  spec.dist.world_size, layout.slack if layout else 0,
                                  trainer.reductions(spec) if trainer else 1)
        if len(iterations) > 1 and not verdict.ok:
            verdict.message = f"iteration {k + 1}: {verdict.message}"
        verdicts.append(verdict)
    return merge_ranks("gradient_volume", verdicts)


def training_verdicts(spec: CaseSpec, result: PoolResult, params: list[ParamInfo], tol: Tolerance) -> list[Verdict]:
    """A training engine's parameters after every step against eager SGD's, and the state it keeps per rank."""
    frozen = {p.name for p in params if not p.trainable}
    if spec.schedule:  # the parameters frozen in each step's iteration (a stack's, by models.schedule)
        frozen = [{f"{i}.{kind}" for kind, mask in zip(("weight", "bias"), masks_at(spec, k)) if mask is not None
                   for i, f in enumerate(mask) if f} for k in range(1, spec.iterations + 1)]
    ranks = dict(enumerate(result.results))
    # Under a policy: its compute, the engine's start, each parameter's update from it, the policy's bound.
    want, got, truth, bound = policy_trajectories(spec, {r: o.params_after_steps for r, o in ranks.items()})
    return [params_after_steps(spec.id, spec.dist.wrapper, want, got, frozen, tol, truth,
                               bound or truth_bound(spec, Record(backend="eager SGD in fp64"))),
            state_verdict(spec, ranks, params)]


def state_verdict(spec: CaseSpec, ranks: dict[int, RankOutcome], params: list[ParamInfo]) -> Verdict:
    """engine_state, or "not observed" for an engine whose TrainStep declares no state()."""
    if any(o.engine_state is None for o in ranks.values()):
        return not_observed("engine_state", spec.id, spec.dist.wrapper, "its TrainStep declares no state() to read "
                            "what it keeps per rank", blocked_by=None)
    return engine_state(spec.id, spec.dist.wrapper, {r: o.engine_state for r, o in ranks.items()}, params,
                        spec.dist.world_size)


def dist_tolerance(spec: CaseSpec, ref: Record) -> Tolerance:
    """The dtype's table; a model family's atol derived from eager's deviation from fp64, as on the torch lane
    (checks.tolerances.derived_tolerance): a sharded reduction reassociates softmax and norm sums too."""
    if spec.model is None:  # the precision the GEMMs ran in: a mixed-precision policy's param dtype
        return tolerance_for(reference_spec(spec), spec.dist.wrapper)
    return derived_tolerance(spec, ref, run_fp64_eager(spec))


def case_timeout(spec: CaseSpec, pool: RankPool) -> float | None:
    """The pool's per-case timeout, times 3 per block for a thunder wrapper on a model family: thunder compiles a
    LoRA Llama block in each rank (about 5 s on a quiet core; a two-block one passed 60 s on 2 loaded cores)."""
    if spec.model is None or not spec.dist.wrapper.startswith("thunder"):
        return None
    return pool.case_timeout_s * 3 * spec.model.blocks


def verify_dist(spec: CaseSpec, pool: RankPool, figures: dict, wrap: Callable | None = None,
                timeout_s: float | None = None) -> list[Verdict]:
    """Run `spec` on every rank of `pool` and return the verdicts; `figures` receives overhead_s."""
    if spec.dist.world_size != pool.world_size:
        raise ValueError(f"[{spec.id}] dist.world_size={spec.dist.world_size}: the rank pool has {pool.world_size} ranks")
    if spec.dist.wrapper == "fairscale_fsdp" and pool.device == "cpu":
        record(FAIRSCALE_STEP)  # applied inside the ranks; the report header is written here
    trainer = engine(spec.dist.wrapper)
    if trainer is not None:  # applied inside the ranks; the report header is written here
        for step in trainer.steps + (trainer.cpu_steps if pool.device == "cpu" else ()):
            record(step)
    wrap = wrap or REGISTERED.get(spec.dist.wrapper)  # a user's declared wrapper, loaded again in each rank
    result = pool.run(run_dist_case, DistCase(spec, wrap), timeout_s or case_timeout(spec, pool),
                      imports=spec.dist.wrapper)
    figures.update(rank_peaks(result))
    figures["overhead_s"] = result.overhead_s
    figures.update(pool.overhead_figures())
    return dist_verdicts(spec, result)
