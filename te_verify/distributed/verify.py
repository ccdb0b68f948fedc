"""Caller side of a distributed case: run it on the pool, build records, apply the distributed checks."""
from __future__ import annotations

from typing import Callable

from te_verify.backends.eager import EagerBackend
from te_verify.checks.collectives import ParamInfo, gradient_volume
from te_verify.checks.dist_parity import dist_grad_parity, dist_output_parity, dist_state_left_behind
from te_verify.checks.reshard import LayerInfo, gathered_peak, reshard_timing
from te_verify.checks.tolerances import tolerance_for
from te_verify.checks.verdict import Verdict
from te_verify.checks.waste import flops_verdict, saved_verdict
from te_verify.compat import record
from te_verify.distributed.case_runner import DistCase, RankOutcome, run_dist_case
from te_verify.distributed.fairscale_compat import STEP as FAIRSCALE_STEP
from te_verify.distributed.pool import PoolResult, RankPool
from te_verify.models import build_model
from te_verify.oracle import BYTES_PER_ELEMENT, input_needs_grad, trainable_masks
from te_verify.record import INPUT_GRAD, Record
from te_verify.runner import run_case
from te_verify.spec import CaseSpec

RESHARD_DEFAULTS = {"fsdp2": True, "fairscale_fsdp": True, "thunder_fsdp": True}


def reshards_after_forward(spec: CaseSpec) -> bool:
    opts = dict(spec.dist.options)
    if spec.dist.wrapper == "fsdp":
        return opts.get("sharding", "FULL_SHARD") == "FULL_SHARD"
    if spec.dist.wrapper == "thunder_fsdp":
        return opts.get("sharding_strategy", "ZERO3") == "ZERO3"
    return bool(opts.get("reshard_after_forward", RESHARD_DEFAULTS.get(spec.dist.wrapper, False)))


def param_infos(spec: CaseSpec) -> list[ParamInfo]:
    weights, biases = trainable_masks(spec)
    out = []
    for k, layer in enumerate(build_model(spec)):
        for name, p in layer.named_parameters(recurse=False):
            trainable = weights[k] if name == "weight" else biases[k]
            out.append(ParamInfo(f"{k}.{name}", tuple(p.shape), p.element_size(), trainable))
    return out


def layer_infos(spec: CaseSpec, params: list[ParamInfo]) -> list[LayerInfo]:
    weights, biases = trainable_masks(spec)
    layer_bytes = [sum(p.nbytes for p in params if p.name.split(".")[0] == str(k)) for k in range(spec.n_layers)]
    return [LayerInfo(layer_bytes[k], weights[k] or biases[k], needs)
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
            record.state_after = {f"param:{name}": value for name, value in outcome.params.items()}
            record.figures, record.observations = outcome.figures, outcome.observations
        records.append(record)
    return records


def local_spec(spec: CaseSpec) -> CaseSpec:
    """What one rank runs: the spec on its shard of the batch (the oracle's figures per rank)."""
    return spec.replace(batch_shape=(spec.batch_shape[0] // spec.dist.world_size, *spec.batch_shape[1:]))


def gathered_weight_allowance(spec: CaseSpec) -> int:
    """Saved bytes a wrapper that keeps parameters gathered between forward and backward (ZeRO-2) may hold as
    plain tensors: the weights whose dgrad backward needs. Nothing for one that reshards after forward."""
    if reshards_after_forward(spec):
        return 0
    return sum(spec.widths[k] * spec.widths[k + 1] * BYTES_PER_ELEMENT[spec.dtype]
               for k, needs in enumerate(input_needs_grad(spec)) if needs)


def rank_waste(spec: CaseSpec, ranks: list[Record]) -> list[Verdict]:
    """Each rank's GEMMs, FLOPs and saved bytes against the oracle of its shard (checks.waste)."""
    backend, local = spec.dist.wrapper, local_spec(spec)
    done = [(rank, record) for rank, record in enumerate(ranks) if record.error is None and record.grads]
    label = lambda rank: f"{spec.id} [{backend} rank {rank}, its shard {local.batch_shape}]"
    flops = [flops_verdict(local, record, backend, label(rank)) for rank, record in done]
    saved = [saved_verdict(local, record, backend, label(rank), gathered_weight_allowance(spec))
             for rank, record in done]
    return [merge_ranks("dist_waste_flops", flops), merge_ranks("dist_waste_saved", saved)]


def merge_ranks(name: str, verdicts: list[Verdict]) -> Verdict:
    """One verdict from the ranks' own: failing if any rank's failed; figures of the worst rank last."""
    figures = {k: v for verdict in sorted(verdicts, key=lambda v: v.ok, reverse=True) for k, v in verdict.figures.items()}
    return Verdict(name, all(v.ok for v in verdicts), "\n".join(v.message for v in verdicts if not v.ok), figures)


def rank_peaks(result: PoolResult) -> dict:
    """The highest rank's peak memory, forward+backward and backward (a figure: judged through gathered_peak,
    see the README's audit)."""
    done = [o for o in result.results if o is not None]
    return {key: max(o.figures.get(key, 0) for o in done) for key in ("peak_bytes", "peak_backward_bytes")} if done else {}


def dist_verdicts(spec: CaseSpec, result: PoolResult) -> list[Verdict]:
    """Parity of gradients, outputs and parameters left behind on every rank; every rank's GEMMs, FLOPs and
    saved bytes against its shard's oracle; communication, reshard timing and gathered peak from rank 0's
    observations."""
    backend, tol = spec.dist.wrapper, tolerance_for(spec, spec.dist.wrapper)
    ref, ranks = run_case(spec, EagerBackend()), rank_records(spec.dist.wrapper, result)
    verdicts = [dist_grad_parity(spec.id, backend, ref, ranks, tol), dist_output_parity(spec.id, backend, ref, ranks, tol),
                dist_state_left_behind(spec.id, backend, ref, ranks, tol)]
    outcome: RankOutcome | None = next((o for o in result.results if o is not None), None)
    if outcome is None or result.errors:
        return verdicts
    verdicts += rank_waste(spec, ranks)
    params = param_infos(spec)
    layers = layer_infos(spec, params)
    verdicts.append(gradient_volume(spec.id, backend, outcome.collectives, params, spec.dist.world_size))
    verdicts.append(reshard_timing(spec.id, backend, outcome.timeline, layers))
    verdicts.append(gathered_peak(spec.id, backend, outcome.timeline, layers, reshards_after_forward(spec)))
    return verdicts


def verify_dist(spec: CaseSpec, pool: RankPool, figures: dict, wrap: Callable | None = None,
                timeout_s: float | None = None) -> list[Verdict]:
    """Run `spec` on every rank of `pool` and return the verdicts; `figures` receives overhead_s."""
    if spec.dist.world_size != pool.world_size:
        raise ValueError(f"[{spec.id}] dist.world_size={spec.dist.world_size}: the rank pool has {pool.world_size} ranks")
    if spec.dist.wrapper == "fairscale_fsdp" and pool.device == "cpu":
        record(FAIRSCALE_STEP)  # applied inside the ranks; the report header is written here
    result = pool.run(run_dist_case, DistCase(spec, wrap), timeout_s)
    figures.update(rank_peaks(result))
    figures["overhead_s"] = result.overhead_s
    figures.update(pool.overhead_figures())
    return dist_verdicts(spec, result)
