"""Fixtures shared by the tests of the TE lane."""
import pytest

from te_verify.te import api as te_api


@pytest.fixture(scope="module")
def te_python():
    """TE's Python over the tex emulation, active for the module's tests (booted once per process)."""
    with te_api.using(te_api.resolve(te_api.CPU_CHOICE)) as impl:
        yield impl
