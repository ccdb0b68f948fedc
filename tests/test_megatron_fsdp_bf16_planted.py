"""Megatron-FSDP with bf16 parameters and fp32 main weights and grads (engines.megatron_fsdp_bf16): an engine wrapper
whose reduce-scatters carry bf16 where the policy says fp32 fails collective_dtypes naming the collective (rank,
index, phase, iteration) and the parameters it reduced; the engine as configured and the same policy with
grad_comm_dtype left to main_grads_dtype pass every check but two recorded gaps of Megatron-FSDP (the
pool tests run two gloo ranks: system); the reduce dtype maps to grad_comm_dtype or is refused (cheap)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from planted_megatron_fsdp_bf16 import (megatron_fsdp_bf16_as_specified, megatron_fsdp_bf16_comm_in_main_grads_dtype,
                                        megatron_fsdp_bf16_reduce_in_bf16)
from te_verify.distributed.engines.megatron_fsdp_bf16 import casts_params_to, policy_fields
from te_verify.distributed.types import WrapperError
from te_verify.matrix.engines import megatron_fsdp_policy_specs
from te_verify.spec import SpecError, validate

SPEC = megatron_fsdp_policy_specs("smoke")[0]  # frozen middle layer, input grad, optim_grads_params, two microbatches
# Recorded gaps of Megatron-FSDP 0.6.1 (expectations/megatron_fsdp.toml), the checks the clean twins fail for reasons
# of their own: fully_shard(module, optimizer) registers frozen parameters with the optimizer (Megatron-LM PR 2471);
# optim_grads_params prefetches every unit in backward (PR 7134).
KNOWN = {"engine_state": "optimizer_state holds", "gathered_peak": "of gathered parameters alive at"}


@pytest.fixture(scope="module")
def pool():
    from te_verify.distributed.engines import engine
    from te_verify.distributed.pool.pool import RankPool

    if engine("megatron_fsdp").unavailable():  # not imported here: Megatron-FSDP loads TE, which the rank loads first
        pytest.skip(engine("megatron_fsdp").unavailable())
    pool = RankPool(world_size=2, case_timeout_s=300.0)
    yield pool
    pool.close(graceful=True)


def _verdicts(pool, wrap) -> dict:
    from te_verify.distributed.verify import verify_dist

    return {v.check: v for v in verify_dist(SPEC, pool, {}, wrap=wrap)}


def _failed(verdicts: dict) -> dict:
    return {name: v.message for name, v in verdicts.items() if not v.ok and name not in KNOWN}


@pytest.mark.system
@pytest.mark.parametrize("wrap", [megatron_fsdp_bf16_as_specified, megatron_fsdp_bf16_comm_in_main_grads_dtype],
                         ids=["as_specified", "comm_in_main_grads_dtype"])
def test_the_engine_as_configured_passes_every_check(pool, wrap):
    verdicts = _verdicts(pool, wrap)
    assert not _failed(verdicts), _failed(verdicts)
    assert all(said in verdicts[check].message for check, said in KNOWN.items())  # the recorded gaps, nothing else
    assert verdicts["collective_dtypes"].figures["reductions_dtype_judged"] > 0
    assert verdicts["collective_dtypes"].figures["gathers_dtype_judged"] > 0
    assert verdicts["params_after_steps"].figures["steps_compared"] == SPEC.iterations


@pytest.mark.system
def test_a_wrapper_reducing_in_bf16_fails_collective_dtypes(pool):
    verdicts = _verdicts(pool, megatron_fsdp_bf16_reduce_in_bf16)
    dtypes = verdicts["collective_dtypes"]
    assert not dtypes.ok and "rank 0: reduce_scatter #" in dtypes.message and "(iteration 1)" in dtypes.message \
        and "reduced the gradients of 3.bias, 3.weight in bfloat16, the policy reduces in float32" in dtypes.message, \
        dtypes.message
    assert "frozen_collectives" not in _failed(verdicts)


def test_grad_comm_dtype_follows_the_reduce_dtype_and_refuses_the_rest():
    assert policy_fields(SPEC) == {"main_params_dtype": torch.float32, "main_grads_dtype": torch.float32,
                                   "grad_comm_dtype": torch.float32}
    bf16 = SPEC.replace(dist=dataclasses.replace(SPEC.dist, reduce_dtype="bf16"))
    assert policy_fields(bf16)["grad_comm_dtype"] == torch.bfloat16
    none = SPEC.replace(dist=dataclasses.replace(SPEC.dist, param_dtype="", reduce_dtype=""))
    assert policy_fields(none) == {} and casts_params_to(none) is None  # no policy: Megatron-FSDP's defaults
    assert casts_params_to(SPEC) == torch.bfloat16
    with pytest.raises(WrapperError, match="dist.reduce_dtype=''"):
        policy_fields(SPEC.replace(dist=dataclasses.replace(SPEC.dist, reduce_dtype="")))
    with pytest.raises(WrapperError, match="dist.param_dtype='fp32'"):
        policy_fields(SPEC.replace(dist=dataclasses.replace(SPEC.dist, param_dtype="fp32")))


def test_the_policy_is_validated_on_megatron_fsdp():
    validate(SPEC)
    with pytest.raises(SpecError, match="dist.reduce_dtype='fp16'"):
        validate(SPEC.replace(dist=dataclasses.replace(SPEC.dist, reduce_dtype="fp16")))


def test_gathered_peak_counts_layers_in_the_policy_param_dtype():
    """Under a bf16 policy the gathered parameters are bf16: four bf16 layers alive at once in backward (Megatron-FSDP
    0.6.1's prefetch of every unit) hold the bytes of two fp32 ones, which gathered_peak took as required before the
    layers were counted in the param dtype; two bf16 layers alive (the one computing and one prefetched) pass."""
    from te_verify.checks.reshard import gathered_peak
    from te_verify.distributed.precision import gathered_layers
    from te_verify.distributed.verify import layer_infos, param_infos

    layers = gathered_layers(SPEC, layer_infos(SPEC, param_infos(SPEC)))
    bf16 = [layer.nbytes for layer in layers]
    assert bf16 == [(32 * 32 + 32) * 2] * 4
    every = gathered_peak(SPEC.id, "megatron_fsdp", [("grad_done", 3, bf16)], layers, True, True)
    assert not every.ok and "8448 B of gathered parameters alive at grad_done(3)" in every.message \
        and "required at most 4224 B" in every.message, every.message
    two = gathered_peak(SPEC.id, "megatron_fsdp", [("grad_done", 3, [0, 0] + bf16[2:])], layers, True, True)
    assert two.ok, two.message
    fp32 = SPEC.replace(dist=dataclasses.replace(SPEC.dist, param_dtype="", reduce_dtype=""))
    assert gathered_layers(fp32, layers) is layers  # no policy: the spec's own bytes
