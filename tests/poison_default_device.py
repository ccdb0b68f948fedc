"""pytest plugin (`-p poison_default_device`): torch's default device becomes "meta" in the process that runs the
cases, once TE's Python has been imported (tensors made at its import are TE's, not the suite's).

A tensor the suite makes without naming its device then lands on the meta device and its case fails, so a run
that passes shows that every tensor it made named its device.
"""
import pytest
import torch


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    from te_verify.te import api as te_api

    te_api.active().api  # noqa: B018 -- boots TE's Python (over the emulation) before the poison
    torch.set_default_device("meta")
