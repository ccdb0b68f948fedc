"""A wrapper's mixed-precision policy (DistConfig.param_dtype / reduce_dtype) as the lane runs and judges it.

The wrapper casts the spec's fp32 parameters to `param_dtype` for forward and backward (and all-gathers them in it)
and reduces gradients in `reduce_dtype`. The reference is eager on the global batch with the same compute precision
(torch.autocast in `param_dtype`: every GEMM's operands in bf16, fp32 accumulation, bf16 results), and the fp64 truth
of the case stays what both are measured against (checks.tolerances.TruthBound): see `policy_bound` for the floor.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from te_verify.checks.collective_dtypes import collective_dtypes
from te_verify.checks.collectives import Collective, ParamInfo
from te_verify.checks.reshard import LayerInfo
from te_verify.checks.tolerances import TRUTH_FACTOR, UNIT_ROUNDOFF, TruthBound
from te_verify.checks.verdict import Verdict
from te_verify.distributed.flat_layout import LAYOUTS
from te_verify.distributed.policy import TORCH_DTYPES, has_policy, policy_dtypes
from te_verify.distributed.rank.training import eager_trajectory
from te_verify.distributed.schedule import reference_iterations
from te_verify.models import frozen_at_backward
from te_verify.record import Record
from te_verify.run.runner import run_fp64_eager
from te_verify.spec import CaseSpec

def reference_spec(spec: CaseSpec) -> CaseSpec:
    """Single-process eager computing as the policy's wrapper does: forward under autocast in the param dtype (a
    bf16 GEMM per linear, bias added in bf16, bf16 activations), backward's GEMMs in it too; fp32 parameters."""
    if not has_policy(spec) or spec.dist.param_dtype in ("", spec.dtype):
        return spec
    return spec.replace(dist=None, autocast=spec.dist.param_dtype)


def policy_bound(spec: CaseSpec, truth: Record) -> TruthBound:
    """The truth bound of a policy's gradients: normwise error vs the fp64 truth at most TRUTH_FACTOR x that of eager
    under the same compute precision, never under a floor of one `param_dtype` rounding per rank. Why per rank: the
    wrapper's backward leaves each rank's partial gradient in the param dtype (one rounding of its local sum) and
    reduces the world_size partials in the reduce dtype (the coarser of the two rounds them), where eager rounds the global sum once; the fp32 reduction
    of world_size terms adds world_size - 1 roundings of 2^-24, below the bf16 ones by 2^15."""
    # The coarser of the compute and the reduce dtype rounds the partials (a reduce in bf16 rounds them again).
    dtype = max(spec.dist.param_dtype or spec.dtype, spec.dist.reduce_dtype or spec.dtype, key=UNIT_ROUNDOFF.get)
    floor = spec.dist.world_size * UNIT_ROUNDOFF[dtype]
    return TruthBound(truth, TRUTH_FACTOR, floor,
                      f"normwise error vs fp64 <= {TRUTH_FACTOR:g} x eager's under autocast {dtype}, floor "
                      f"{spec.dist.world_size} x u({dtype}) = {floor:.3g} x |truth| (one rounding per rank's partial)")


def policy_truth(spec: CaseSpec) -> tuple[dict | None, TruthBound | None]:
    """The fp64 truth's gradients of the measured pass and the policy's bound; (None, None) without a policy (the
    lane's tolerance table judges)."""
    if not has_policy(spec):
        return None, None
    truth = run_fp64_eager(reference_spec(spec))
    return truth.grads[-1], policy_bound(spec, truth)


def policy_schedule_truth(spec: CaseSpec, bound: TruthBound | None) -> tuple[list[dict] | None, TruthBound | None]:
    """Under a freeze schedule: the fp64 truth's gradients of iterations 2.. and the policy's bound (None, None
    without a policy)."""
    if bound is None:
        return None, None
    return reference_iterations(reference_spec(spec), truth=True), bound


def policy_collectives(spec: CaseSpec, ranks: dict[int, list[Collective]],
                       params_at: Callable[[int], list[ParamInfo]], shards: bool) -> Verdict:
    """checks.collective_dtypes against the spec's policy (torch's dtype names)."""
    param, reduce = (str(d).removeprefix("torch.") if d is not None else "" for d in policy_dtypes(spec))
    return collective_dtypes(spec.id, spec.dist.wrapper, ranks, params_at, param, reduce, shards,
                             spec.dist.world_size)


def gathered_layers(spec: CaseSpec, layers: list[LayerInfo]) -> list[LayerInfo]:
    """The layers' bytes as a sharding wrapper gathers them: in its param dtype under a policy (FSDP1/FSDP2 gather
    the cast parameters, DeepSpeed and Megatron-FSDP hold them in it), not in the spec's fp32, and laid out as the
    wrapper flattens a unit (flat_layout.LAYOUTS: FSDP1's alignment padding), so that gathered_peak's required figure
    is the bytes of as many layers as it needs; `layers` as they are where neither applies."""
    param = policy_dtypes(spec)[0] if has_policy(spec) else None
    layout = LAYOUTS.get(spec.dist.wrapper)
    if param is None and layout is None:
        return layers
    size = TORCH_DTYPES[spec.dtype].itemsize
    itemsize = param.itemsize if param is not None else size

    def gathered(layer: LayerInfo) -> int:
        if layout is not None and layer.numels:
            return layout(layer.numels, itemsize, spec.dist.world_size)
        return layer.nbytes // size * itemsize

    return [dataclasses.replace(layer, nbytes=gathered(layer)) for layer in layers]


def start_of(spec: CaseSpec) -> torch.dtype | None:
    """The dtype the case's engine casts the model's parameters to in place when it wraps (Engine.casts_params_to:
    DeepSpeed's bf16 section), so that its training starts from their rounding; None for every other wrapper."""
    from te_verify.distributed.engines import engine  # the engines import this module

    trainer = engine(spec.dist.wrapper)
    return trainer.casts_params_to(spec) if trainer is not None else None


def rounded_start(ref: Record, dtype: torch.dtype | None) -> Record:
    """Eager's record with its parameters before and after the run rounded to `dtype` (kept in their own dtype): what
    an engine that casts them in place must leave, bitwise (checks.state); `ref` itself where `dtype` is None."""
    if dtype is None:
        return ref

    def rounded(state: dict) -> dict:
        return {k: v.to(dtype).to(v.dtype) if k.startswith("param:") else v for k, v in state.items()}

    return dataclasses.replace(ref, state_before=rounded(ref.state_before), state_after=rounded(ref.state_after))


def policy_trajectories(spec: CaseSpec, ranks: dict[int, list[dict]]
                        ) -> tuple[list[dict], dict[int, list[dict]], list[dict], TruthBound | None]:
    """(eager SGD's trajectory, the ranks', the fp64 truth's, the bound) as params_after_steps judges an engine. Under
    a policy: eager's forwards under autocast in the param dtype, every trajectory from the parameters as the engine
    starts them, and each parameter as its update from that start, so that the policy's bound (relative to the truth's
    norm) is relative to the update's, which carries every error of the steps, not to the parameter's: a skipped step
    moves a parameter by far less than one bf16 rounding of it. Without a policy: the trajectories and None (the
    caller's fp32 bound judges)."""
    start = start_of(spec)
    truth = eager_trajectory(spec, torch.float64, start=start)
    if not has_policy(spec):
        return eager_trajectory(spec, start=start), ranks, truth, None
    origin = {n: p.detach().to(start or p.dtype).double() for n, p in frozen_at_backward(spec).named_parameters()}

    def updates(steps: list[dict]) -> list[dict]:
        return [{n: None if v is None or n not in origin else v - origin[n].to(v.dtype) for n, v in step.items()}
                for step in steps]

    want = eager_trajectory(spec, start=start, autocast=policy_dtypes(spec)[0])
    return (updates(want), {r: updates(steps) for r, steps in ranks.items()}, updates(truth),
            policy_bound(spec, Record(backend="eager SGD in fp64")))
