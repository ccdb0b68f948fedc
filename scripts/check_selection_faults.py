"""Does the chosen pr tier still catch every planted fault the full pr candidate set catches?

Runs each planted torch-lane backend of tests/ (a wrong gradient, a gradient kept for a frozen weight, a dropped
gradient, a diverging or raising replay, a wrong output, a written frozen bias, wasted GEMMs and saves, LoRA
faults, a library model's LoRA base computing its frozen wgrad) over every pr candidate of the families it applies
to, and over the pr tier te_verify.matrix.selection chooses for it, and prints how many cases each fails: a fault caught
by the candidates must be caught by the choice.

    PYTHONPATH=tests .venv/bin/python scripts/check_selection_faults.py
"""
from __future__ import annotations

import sys

from planted_backends import (DropsGrad, GradForFrozen, OffByOnePercent, RaisesOnReplay, ReplayDiverges,
                              WritesFrozenBias, WrongOutput)
from planted_lora import PlantedLoRA
from planted_real_models import DiscardedBaseWgrad
from waste_planted import PlantedBackend

from te_verify.run.caserun import CaseRun
from te_verify.matrix.stacks import FAMILIES
from te_verify.matrix.models import hf_peft_specs, litgpt_lora_specs, lora_specs, stage_specs
from te_verify.matrix.selection import select_pr

STACKS = {name: gen for name, gen in FAMILIES.items()}
MODELS = {"lora": lora_specs, "stages": stage_specs}
PLANTED = [(b, STACKS) for b in (OffByOnePercent(), GradForFrozen(), DropsGrad(), ReplayDiverges(), RaisesOnReplay(),
                                 WrongOutput(), WritesFrozenBias(), PlantedBackend("discarded_wgrad"),
                                 PlantedBackend("weight_copy"), PlantedBackend("extra_activation"),
                                 PlantedBackend("big_temporary"))]
PLANTED += [(PlantedLoRA(fault), MODELS) for fault in ("discarded_wgrad", "save_twice", "drop_b")]
PLANTED += [(DiscardedBaseWgrad(), {"hf_peft": hf_peft_specs, "litgpt_lora": litgpt_lora_specs})]


def failures(backend, families: dict, chosen: bool) -> int:
    count = 0
    for family, gen in families.items():
        specs = gen("pr")
        if chosen:
            specs = select_pr(family, backend.name, specs)[0]
        for spec in specs:
            try:
                CaseRun(spec, backend.name, backend).verify()
            except Exception:  # a check failing (or the fault raising) is what a planted backend is for
                count += 1
    return count


def main() -> int:
    missed = []
    for backend, families in PLANTED:
        full, chosen = failures(backend, families, False), failures(backend, families, True)
        print(f"{backend.name:32s} fails {full:4d} pr candidates, {chosen:4d} chosen pr cases", flush=True)
        if full and not chosen:
            missed.append(backend.name)
    print("every planted fault the candidates catch, the chosen pr tier catches" if not missed else
          f"MISSED by the chosen pr tier: {', '.join(missed)}")
    return int(bool(missed))


if __name__ == "__main__":
    sys.exit(main())
