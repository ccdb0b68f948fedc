"""Caller side of a distributed case: run it on the pool, build records, apply the distributed checks."""
from __future__ import annotations

from typing import Callable

from te_verify.backends.eager import EagerBackend
from te_verify.checks.collectives import ParamInfo, gradient_volume
from te_verify.checks.dist_parity import dist_grad_parity
from te_verify.checks.reshard import LayerInfo, gathered_peak, reshard_timing
from te_verify.checks.tolerances import tolerance_for
from te_verify.checks.verdict import Verdict
from te_verify.compat import record
from te_verify.distributed.case_runner import DistCase, RankOutcome, run_dist_case
from te_verify.distributed.fairscale_compat import STEP as FAIRSCALE_STEP
from te_verify.distributed.pool import PoolResult, RankPool
from te_verify.models import build_model
from te_verify.oracle import input_needs_grad, trainable_masks
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
        records.append(record)
    return records


def dist_verdicts(spec: CaseSpec, result: PoolResult) -> list[Verdict]:
    """Parity for every rank; communication, reshard timing and peak from rank 0's observations."""
    backend = spec.dist.wrapper
    ref = run_case(spec, EagerBackend())
    verdicts = [dist_grad_parity(spec.id, backend, ref, rank_records(backend, result), tolerance_for(spec, backend))]
    outcome: RankOutcome | None = next((o for o in result.results if o is not None), None)
    if outcome is None or result.errors:
        return verdicts
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
    figures["overhead_s"] = result.overhead_s
    figures.update(pool.overhead_figures())
    return dist_verdicts(spec, result)
