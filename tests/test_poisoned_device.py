"""With torch's default device poisoned to "meta" in the process running the cases, the eager and TE lanes run
with --device cpu without a failure: every tensor the suite makes (models, inputs, cotangents, main_grad, the
eager reference runs, the tex emulation's and the reference TE's state) names its device."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from pytest_many import run_many

ROOT = Path(__file__).resolve().parents[1]
TE_FAMILIES = ["cases/test_te_fp8.py", "cases/test_te_peft.py", "cases/test_te_replay.py", "cases/test_te_contract.py",
               "cases/test_te_delayed.py"]
RUNS = {
    # TE's modules over the tex emulation (the default here) and the eager torch lane. thunder_te is left out:
    # the suite's tensors in its cases are te_eager's (models, inputs, cotangents), the rest is thunder's own.
    "emulated": ["cases/test_freeze.py", "cases/test_bias.py", "cases/test_lora.py", "cases/test_stages.py",
                 *TE_FAMILIES, "cases/test_te_moe.py", "cases/test_te_lora.py",
                 "--backend", "eager", "--backend", "te_eager"],
    # The reference TE.
    "reference": [*TE_FAMILIES, "cases/test_te_moe.py", "cases/test_te_lora.py", "--te-impl", "reference",
                  "--backend", "te_eager"],
}


@pytest.mark.system
def test_eager_and_te_lanes_pass_with_the_default_device_poisoned(tmp_path):
    """Both runs in one interpreter (tests/pytest_many.py), poisoned from the first run's start on."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    runs = [["-p", "poison_default_device", "--tier", "smoke", "--device", "cpu", "--report-dir", str(tmp_path / name),
             *args] for name, args in RUNS.items()]
    results, proc = run_many(runs, env=env)
    codes = [result["code"] for result in results]
    assert codes == [0] * len(RUNS), proc.stdout[-4000:]
    for name in RUNS:
        rows = json.loads((tmp_path / name / "results.json").read_text())["rows"]
        assert not [r for r in rows if r["outcome"] in ("failed", "error", "xpassed")]
        assert {r["device"] for r in rows} == {"cpu"}
        passed = Counter(r["backend"] for r in rows if r["outcome"] == "passed")
        assert passed["te_eager"] and (name == "reference" or passed["eager"]), f"{name}: {passed}"
