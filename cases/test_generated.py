"""Nightly: hypothesis-drawn specs of any shape, mask, dtype, replay count and freeze timing; and Llama-family
specs of any block count, LoRA targets, rank, frozen stages, dtype and replays (a fifth of the examples: a
compiled block costs seconds where a linear stack costs milliseconds).

Shrinks to the smallest failing spec; runs only in the nightly tier (`--max-examples` per backend). The draws are
seeded by the UTC date (or --hypothesis-seed), with no example database: runs on one day give the same verdicts,
and each night explores new specs. A drawn spec failing as a recorded gap describes (an expectation with a glob
and a `failure` text, family "generated") is that gap, not a finding.
"""
import datetime

import pytest
from hypothesis import HealthCheck, given, seed, settings

from te_verify.run.caserun import CaseRun
from te_verify.matrix.stacks import case_specs
from te_verify.matrix.models import model_case_specs
from te_verify.matrix.tiers import GENERATED
from te_verify.plugin import known_gap

FAMILY = GENERATED
LANE = "torch"


def SPECS(tier: str) -> list:
    return []  # drawn by hypothesis below, not enumerated


def test_generated(lane_backend, request):
    check_drawn(lane_backend, request, case_specs(), request.config.getoption("max_examples"))


def test_generated_models(lane_backend, request):
    check_drawn(lane_backend, request, model_case_specs(), max(1, request.config.getoption("max_examples") // 5))


def check_drawn(lane_backend, request, specs, examples: int) -> None:
    """Verify `examples` specs drawn from `specs` on the backend; a drawn spec failing as a recorded gap passes."""
    if request.config.getoption("tier") != "nightly":
        pytest.skip("hypothesis-drawn cases run in the nightly tier")
    name, backend = lane_backend

    @seed(nightly_seed(request.config))
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(spec=specs)
    def check(spec):
        try:
            CaseRun(spec, name, backend).verify()
        except AssertionError as failure:
            if not known_gap(request, name, spec, failure):  # a recorded gap is not this test's finding
                raise

    check()


def nightly_seed(config: pytest.Config) -> int | str:
    """--hypothesis-seed when given, else today's UTC date as YYYYMMDD."""
    given_seed = config.getoption("hypothesis_seed", None)
    return given_seed if given_seed is not None else int(datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d"))
