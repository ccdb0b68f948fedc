"""The tier at which the tests that prove a correct implementation passes a whole lane run it.

Those tests (split-K at the tex boundary and in the torch lane, another accumulation order, fp64 inside, a user's
external backend) each run every case of a lane through a second implementation. At the pr tier that is four runs of
160-226 cases, about 60% of the test command's 5-minute budget on a 2-core machine; at the smoke tier (every family,
~1/6 of the cases) it is seconds. The test command runs them at smoke; `scripts/proofs.sh` (the nightly workflow's
`proofs` job) runs them at pr (docs/tiers.md).
"""
from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

CASES = Path(__file__).resolve().parent.parent / "cases"

PROOF_TIERS = ("smoke", "pr", "nightly")
PROOF_TIER = os.environ.get("TE_VERIFY_PROOF_TIER", "smoke")
if PROOF_TIER not in PROOF_TIERS:
    raise SystemExit(f"TE_VERIFY_PROOF_TIER={PROOF_TIER!r}: expected one of {', '.join(PROOF_TIERS)}")
# pytest -n for the proof runs: in-process at smoke (an xdist controller and two workers cost three interpreter
# start-ups, more than the smoke cases themselves), two workers at the larger tiers.
PROOF_WORKERS = "0" if PROOF_TIER == "smoke" else "2"


def torch_lane_cases(tier: str = PROOF_TIER) -> int:
    """How many torch-lane cases the tier generates for one backend: every cases/ module of the torch lane, read from
    the modules themselves (SPECS, LANE), so a new family is counted without being listed here."""
    return sum(len(specs(tier)) for specs in _torch_lane_generators())


@functools.cache
def _torch_lane_generators() -> tuple:
    """The SPECS of cases/ modules whose LANE is "torch" (each module loaded once per process)."""
    generators = []
    for path in sorted(CASES.glob("test_*.py")):
        spec = importlib.util.spec_from_file_location(f"_proof_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if getattr(module, "LANE", None) == "torch" and hasattr(module, "SPECS"):
            generators.append(module.SPECS)
    return tuple(generators)
