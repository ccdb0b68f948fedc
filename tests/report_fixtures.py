"""Sample results.json payloads (schema_version 1) for the report, diff, repro and expectations tests."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from te_verify.spec import CaseSpec, TEConfig

FREEZE = CaseSpec("freeze", (32, 32, 32, 32, 32), (True, False, True, False), (True, False, True, False))
FREEZE_X = FREEZE.replace(input_requires_grad=True)
REPLAY = CaseSpec("replay", (16, 16, 16), (False, True), None, replays=2)
PEFT_TE = CaseSpec("te_peft", (32, 64, 128, 64, 32), (True, False, True, False), None, te=TEConfig(recipe="delayed"))


def header(run_id: str = "20260101-020000") -> dict:
    return {
        "run_id": run_id, "started": "2026-01-01T02:00:00", "finished": "2026-01-01T02:05:00", "tier": "pr",
        "argv": ["te-verify", "run", "--tier", "pr"],
        "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "thunder": "0.2.6", "fairscale": "0.4.13",
                     "transformer_engine": "absent: ModuleNotFoundError: No module named 'transformer_engine'"},
        "device": "cpu: x86_64", "te_impl": {"name": "reference", "why": "transformer_engine is not importable"},
        "compat": ["thunder named-tensor stand-ins (torch 2.13 removed Tensor.align_as, ...)"],
        "backends": {"eager": "available", "thunder": "available", "thunder_te": "available",
                     "te_eager": "unavailable: needs CUDA"},
    }


def row(spec: CaseSpec, backend: str, outcome: str, figures: dict | None = None, reason: str = "",
        duration: float = 0.5, expectation: dict | None = None) -> dict:
    test = f"test_{spec.family}"
    return {
        "nodeid": f"cases/{test}.py::{test}[{backend}-{spec.id}]", "case_id": spec.id, "family": spec.family,
        "backend": backend, "outcome": outcome, "reason": reason, "duration": duration,
        "figures": figures or {}, "spec": spec.to_dict(), "expectation": expectation, "worker": "gw0",
    }


THUNDER_TE_GAP = {"file": "expectations/thunder_te.toml", "prefix": PEFT_TE.id, "status": "xfail",
                  "reason": "thunder TE executor computes wgrad of frozen weights",
                  "link": "https://github.com/Lightning-AI/lightning-thunder/issues/2076"}


def results(run_id: str = "20260101-020000") -> dict:
    """A small, clean night: passes, a known gap, a skip, figures with waste ratios of 1.0."""
    waste = {"flops_actual": 100, "flops_required": 100, "flops_ratio": 1.0,
             "saved_bytes_actual": 4096, "saved_bytes_required": 4096, "saved_bytes_ratio": 1.0, "peak_bytes": 65536}
    rows = [
        row(FREEZE, "eager", "passed", dict(waste)),
        row(FREEZE, "thunder", "passed", dict(waste)),
        row(FREEZE_X, "thunder", "passed", dict(waste)),
        row(REPLAY, "thunder", "passed", {"compilations": 1}),
        row(PEFT_TE, "thunder_te", "xfailed", {"flops_ratio": 1.5}, reason="known gap: wgrad of frozen weights",
            expectation=dict(THUNDER_TE_GAP)),
        row(PEFT_TE, "te_eager", "skipped", reason="te_eager unavailable: needs CUDA"),
    ]
    return {"schema_version": 1, "header": header(run_id), "rows": rows}


def regressed(old: dict) -> dict:
    """The next night with two planted regressions: FREEZE on thunder fails; FREEZE_X's flops ratio 1.0 -> 1.3."""
    new = copy.deepcopy(old)
    new["header"]["run_id"] = "20260102-020000"
    for r in new["rows"]:
        if (r["case_id"], r["backend"]) == (FREEZE.id, "thunder"):
            r["outcome"], r["reason"] = "failed", f"[{FREEZE.id}] backend thunder: 1.weight: gradient is None after pass 1"
        if (r["case_id"], r["backend"]) == (FREEZE_X.id, "thunder"):
            r["figures"].update(flops_actual=130, flops_ratio=1.3)
    return new


def write(path: Path, payload: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    return path
