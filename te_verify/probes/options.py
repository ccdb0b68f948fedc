"""pytest options of the probes (registered by te_verify.plugin.LANE_PLUGINS)."""
from __future__ import annotations

import pytest

DEFAULT_MAX_RISE = 0.10


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("te_verify").addoption(
        "--max-rise", type=float, default=DEFAULT_MAX_RISE, dest="max_rise",
        help=f"compare_options family: largest allowed relative rise of saved bytes, saved count or peak "
             f"from the baseline option set to the candidate (default {DEFAULT_MAX_RISE})")
