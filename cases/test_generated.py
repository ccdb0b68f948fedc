"""Nightly: hypothesis-drawn specs of any shape, mask, dtype, replay count and freeze timing.

Shrinks to the smallest failing spec; runs only in the nightly tier (`--max-examples` per backend).
"""
import pytest
from hypothesis import HealthCheck, given, settings

from te_verify.caserun import CaseRun
from te_verify.matrix import case_specs

FAMILY = "generated"
LANE = "torch"


def SPECS(tier: str) -> list:
    return []  # drawn by hypothesis below, not enumerated


def test_generated(lane_backend, request):
    if request.config.getoption("tier") != "nightly":
        pytest.skip("hypothesis-drawn cases run in the nightly tier")
    name, backend = lane_backend

    @settings(max_examples=request.config.getoption("max_examples"), deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(spec=case_specs())
    def check(spec):
        CaseRun(spec, name, backend).verify()

    check()
