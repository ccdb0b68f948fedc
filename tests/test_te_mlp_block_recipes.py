"""TE 2.20.2's LayerNormMLP under MXFP8BlockScaling and NVFP4BlockScaling at emulated sm100 (its activation quantizing
fc2's input, dbias_d<act> fc1's gradient under MXFP8) against fp32 torch, and the gated MXFP8 activations bitwise
(tests/mlp_block_recipe_e2e.py, one interpreter booted at sm100: this process may be booted at sm90)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system  # another interpreter (scripts/system_tests.sh)

ROOT = Path(__file__).resolve().parents[1]
RUNS = [f"{r} {a}" for r in ("mxfp8", "nvfp4") for a in ("gelu", "srelu", "swiglu")] + ["gated mxfp8 exact"]


@pytest.fixture(scope="module")
def results() -> dict[str, list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "mlp_block_recipe_e2e.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("run", RUNS)
def test_layernorm_mlp_block_recipe_run(results, run: str) -> None:
    assert results[run] == [], "; ".join(results[run][:4])
