"""A wrapper's mixed-precision policy in the distributed lane (issue 34's must-show "a reduce in bf16 where the policy
says fp32"): FSDP2 whose reduce dtype was left unset reduces in bf16, and collective_dtypes fails naming the
reduce-scatter, its rank and the parameters whose gradients it reduced; the other checks pass (the reduction's volume
is counted in elements, its accuracy stays within the bound). The clean twin (the policy as the spec says) and FSDP1's
MixedPrecision pass every check; a gradient 1% high under the policy fails dist_grad_parity (the bound is bf16's, not
loosened)."""
from __future__ import annotations

import dataclasses

import pytest

from planted_mixed_precision import (fsdp2_policy_as_specified, fsdp2_policy_grad_one_percent_high,
                                     fsdp2_reduce_dtype_unset)
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import mixed_precision_specs

PR = {spec.dist.wrapper: spec for spec in mixed_precision_specs("smoke")}


@pytest.fixture
def pool(rank_pool):  # the session's pool (same size and timeout): no pool start of its own
    return rank_pool


def _verdicts(pool, spec, wrap=None) -> dict:
    return {v.check: v for v in verify_dist(spec, pool, {}, wrap=wrap)}


def test_fsdp2_reducing_in_bf16_where_the_policy_says_fp32_fails_collective_dtypes(pool):
    verdicts = _verdicts(pool, PR["fsdp2"], fsdp2_reduce_dtype_unset)
    dtypes = verdicts["collective_dtypes"]
    assert not dtypes.ok and dtypes.blocked_by is None, dtypes.message
    for rank in (0, 1):
        assert (f"rank {rank}: reduce_scatter #" in dtypes.message and "in backward (iteration 1) reduced the "
                "gradients of 3.weight, 3.bias in bfloat16, the policy reduces in float32" in dtypes.message), \
            dtypes.message
    failed = {name for name, v in verdicts.items() if not v.ok}
    assert failed == {"collective_dtypes"}, {n: verdicts[n].message for n in failed}


@pytest.mark.parametrize("wrapper", ["fsdp2", "fsdp"])
def test_the_policy_as_specified_passes(pool, wrapper):
    wrap = fsdp2_policy_as_specified if wrapper == "fsdp2" else None
    verdicts = _verdicts(pool, PR[wrapper], wrap)
    failed = {name: v.message for name, v in verdicts.items() if not v.ok}
    assert not failed, failed
    figures = verdicts["collective_dtypes"].figures
    assert figures["reductions_dtype_judged"] > 0 and figures["gathers_dtype_judged"] > 0, figures
    assert "one rounding per rank's partial" in verdicts["dist_grad_parity"].figures["tolerance"]


def test_a_gradient_one_percent_high_fails_the_policys_truth_bound(pool):
    verdicts = _verdicts(pool, PR["fsdp2"], fsdp2_policy_grad_one_percent_high)
    parity = verdicts["dist_grad_parity"]
    assert not parity.ok and "rank 0: grad of 2.weight: error vs the fp64 truth" in parity.message, parity.message
    assert "grad of 3.weight" not in parity.message and verdicts["collective_dtypes"].ok


def test_no_collective_seen_is_not_observed():
    from te_verify.checks.collective_dtypes import collective_dtypes

    verdict = collective_dtypes("case", "fsdp2", {0: [], 1: []}, lambda k: [], "bfloat16", "float32", True, 2)
    assert not verdict.ok and "not observed" in verdict.message, verdict.message


def test_a_policy_on_a_wrapper_without_one_is_refused_naming_it():
    from te_verify.spec import SpecError

    spec = PR["fsdp2"]
    with pytest.raises(SpecError, match="wrapper 'ddp' takes no policy"):
        spec.replace(dist=dataclasses.replace(spec.dist, wrapper="ddp", options=()))
