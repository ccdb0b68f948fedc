"""TE 2.20.2's te.Linear and te.GroupedLinear forward + backward under MXFP8BlockScaling, NVFP4BlockScaling and
Float8BlockScaling (converted to MXFP8 by TE's C++ there) at emulated sm100, against block_recipe_e2e's independent
dequantize-then-matmul; each planted fault of planted_block_quantizers fails the recipes it concerns, for its own
reason, and leaves the others passing. One interpreter booted at sm100 (this process may be booted at sm90)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Every test reads one interpreter booted at sm100 (a subprocess): the system tests' (scripts/system_tests.sh).
pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("mxfp8", "nvfp4", "block")
# Planted fault -> (recipes it must fail, the reason every failure of it gives).
CAUGHT = {"e8m0_rounded_down": (("mxfp8",), "off their quantization grid"),
          "neighbouring_block_scale": (("mxfp8", "nvfp4"), "vs dequantize-then-matmul"),
          "nvfp4_per_tensor_scale_ignored": (("nvfp4",), "off their quantization grid")}


@pytest.fixture(scope="module")
def results() -> dict[str, list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "block_recipe_e2e.py"), "sm100", *RECIPES],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["linear", "grouped"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_clean_recipe_matches_dequantize_then_matmul(results, recipe: str, module: str) -> None:
    failures = results[f"{recipe} {module} clean"]
    assert failures == [], "; ".join(failures[:4])


@pytest.mark.parametrize("fault", CAUGHT)
def test_planted_fault_fails_its_recipes_for_its_reason(results, fault: str) -> None:
    caught, reason = CAUGHT[fault]
    for recipe in RECIPES:
        failures = results[f"{recipe} linear {fault}"]
        if recipe in caught:
            assert failures, f"planted {fault} passed {recipe}"
            assert all(reason in f for f in failures), f"{fault} on {recipe}: {failures[:3]}"
        else:
            assert failures == [], f"planted {fault} is not about {recipe}, yet: {failures[:3]}"
