"""Which cases a capability pass of the main job collects (`--capability-cases` on an emulated device): the TE
cases that run at the emulated capability (te_verify.matrix.capability), every other lane in the default
capability's pass only. On a GPU the hardware's capability decides and every case is collected.
"""
from __future__ import annotations

from typing import Protocol, TypeVar

import pytest
import torch

from te_verify.matrix.capability import DEFAULT as DEFAULT_CAPABILITY, runs_at
from te_verify.spec import CaseSpec
from te_verify.te import api as te_api


class _Run(Protocol):
    spec: CaseSpec  # a case run (te_verify.run.caserun.CaseRun): only its spec decides its pass


Run = TypeVar("Run", bound=_Run)


def _emulated_capability(lane: str) -> str | None:
    """The emulated compute capability a TE-lane case runs at (None: another lane, or a GPU's own)."""
    return te_api.capability() if lane == "te" and not torch.cuda.is_available() else None


def capability_pass(config: pytest.Config, lane: str, runs: list[Run]) -> list[Run]:
    """With --capability-cases on an emulated device: the TE cases that run at this capability; other lanes run
    in the default capability's pass only."""
    if not config.getoption("capability_cases") or torch.cuda.is_available():
        return runs
    here = te_api.capability()
    if lane != "te":
        return runs if here == DEFAULT_CAPABILITY else []
    return [run for run in runs if runs_at(run.spec, here)]


def drawing_pass(config: pytest.Config, pairs: list) -> list:
    """With --capability-cases on an emulated device: a test drawing its own specs runs in the default capability's
    pass only (its specs are not known before it runs, so no other pass can claim them)."""
    if not config.getoption("capability_cases") or torch.cuda.is_available():
        return pairs
    return pairs if te_api.capability() == DEFAULT_CAPABILITY else []


def capability_suffix(lane: str) -> str:
    """A TE case's id names an emulated capability other than the default (the main job runs some at both)."""
    here = _emulated_capability(lane)
    return f"-{here}" if here not in (None, DEFAULT_CAPABILITY) else ""
