"""compare_options: rise arithmetic, a clean pair passes, a planted rise beyond --max-rise fails."""
from __future__ import annotations

import pytest

from te_verify.run import compare_options as compare
from te_verify.spec import CaseSpec
from waste_planted import PlantedBackend

SPEC = CaseSpec("compare", (16, 24, 40, 8), (False, True, False), None, False, (32,))


def test_rise():
    assert compare.rise(100, 112) == 0.12
    assert compare.rise(0, 0) == 0.0 and compare.rise(0, 5) is None


def test_equal_option_sets_pass_and_a_planted_rise_fails(monkeypatch):
    monkeypatch.setitem(compare.OPTION_SETS, "planted", (PlantedBackend, PlantedBackend))
    same = compare.compare_options(SPEC, "planted", 0.10)
    assert same.ok and same.figures["saved_bytes_actual_rise"] == 0.0
    monkeypatch.setitem(compare.OPTION_SETS, "planted", (PlantedBackend, lambda: PlantedBackend("extra_activation")))
    worse = compare.compare_options(SPEC, "planted", 0.10)
    assert not worse.ok and "saved_bytes_actual 5,120 -> 15,360 (rise 2.0)" in worse.message
    assert compare.compare_options(SPEC, "planted", 5.0).ok


@pytest.mark.parametrize("backend_name", sorted(compare.OPTION_SETS))
def test_real_option_sets_run(backend_name):
    verdict = compare.compare_options(SPEC, backend_name, 0.10)
    assert verdict.figures["saved_bytes_actual_base"] > 0, verdict.message
