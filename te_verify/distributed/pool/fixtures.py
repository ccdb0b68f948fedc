"""pytest fixtures of the distributed lane: one rank pool per process (per xdist worker).

Registered by te_verify.plugin.LANE_PLUGINS. `--world-size N` sets the pool's size. The pool starts from this
worker's device; on GPUs a world that does not fit the GPUs this worker sees skips every distributed case with
the reason.
"""
from __future__ import annotations

import pytest

from te_verify import device as run_device
from te_verify.distributed.pool.pool import RankPool

DEFAULT_CASE_TIMEOUT_S = 60.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("te_verify distributed")
    group.addoption("--world-size", type=int, default=2, help="ranks in the distributed lane's pool (default 2)")
    group.addoption("--dist-timeout", type=float, default=DEFAULT_CASE_TIMEOUT_S,
                    help="seconds a distributed case may take before its ranks count as hung")


@pytest.fixture(scope="session")
def rank_pool(request: pytest.FixtureRequest):
    """The persistent pool; started on first use, rebuilt by the pool itself after a hang or crash."""
    pool = RankPool(world_size=request.config.getoption("--world-size"),
                    case_timeout_s=request.config.getoption("--dist-timeout"), device=str(run_device.active()))
    try:
        pool.rank_devices()
    except run_device.DeviceError as exc:
        pytest.skip(f"distributed lane: {exc}")  # a session fixture: every distributed case skips with it
    yield pool
    pool.close(graceful=True)
