"""Autocast cases (CaseSpec.autocast): the spec field, eager and a clean twin pass every check, and the planted
saves of cast weight copies fail waste_saved naming the layer and its weight, every other check passing."""
from __future__ import annotations

import pytest

from te_verify.backends.eager import EagerBackend
from te_verify.checks.verdict import CheckFailures
from te_verify.matrix.models import LORA_TARGETS, model_spec
from te_verify.run.caserun import CaseRun
from te_verify.spec import CaseSpec, ModelConfig, SpecError
from planted_autocast import CastLinear

# Layer 0's weight frozen (its bias trains, so it has a backward) and the input needs no grad: layer 0's dgrad is
# not needed, so its cast weight must not be kept; layer 1 frozen behind a trainable layer: its cast weight is kept
# for dgrad, its input is not. Distinct widths so every weight shape names one layer.
FIRST_FROZEN = CaseSpec("autocast", (16, 24, 40, 8), (True, True, False), (False, True, False), False, (32,),
                        autocast="bf16")
MIDDLE_FROZEN = FIRST_FROZEN.replace(weight_frozen=(False, True, False), bias_frozen=(False, True, False))


def verdicts(spec: CaseSpec, backend) -> dict:
    """Every check of the full case (eager reference, fp64 truth, probes) by name; raises nothing."""
    case = CaseRun(spec, backend.name, backend)
    try:
        found = case.verify()
    except CheckFailures as failure:
        found = failure.verdicts
    return {v.check: v for v in found}


def failed(found: dict) -> set[str]:
    return {name for name, v in found.items() if not v.ok}


def test_the_field_is_validated_and_named_only_off_its_default():
    plain = FIRST_FROZEN.replace(autocast="")
    assert "-acbf16-" in FIRST_FROZEN.id and "ac" not in plain.id.split("-fp32-")[1]
    assert FIRST_FROZEN.id.replace("-acbf16", "") == plain.id
    with pytest.raises(SpecError, match=r"^autocast='bf16' needs dtype='fp32'"):
        plain.replace(dtype="bf16", autocast="bf16")
    with pytest.raises(SpecError, match=r"^autocast='fp16': expected one of"):
        plain.replace(autocast="fp16")
    assert CaseSpec.from_dict(FIRST_FROZEN.to_dict()) == FIRST_FROZEN


@pytest.mark.parametrize("spec", [FIRST_FROZEN, MIDDLE_FROZEN], ids=lambda s: s.id)
@pytest.mark.parametrize("backend", [EagerBackend(), CastLinear()], ids=lambda b: b.name)
def test_eager_and_a_correct_cast_written_otherwise_pass(spec, backend):
    found = verdicts(spec, backend)
    assert failed(found) == set(), [v.message for v in found.values() if not v.ok]
    saved = found["waste_saved"].figures
    assert saved["saved_bytes_actual"] == saved["saved_bytes_required"] > 0


def test_a_saved_cast_copy_of_a_frozen_weight_fails_waste_saved():
    found = verdicts(FIRST_FROZEN, CastLinear("frozen_weight_copy"))
    assert failed(found) == {"waste_saved"}
    assert ("layer 0 (input needs no grad, dgrad not needed): saved weight_copy [24, 16] 768 B, 0 required "
            "(a torch.bfloat16 copy of layer 0's frozen weight)") in found["waste_saved"].message


def test_a_second_cast_copy_of_a_weight_fails_waste_saved():
    found = verdicts(MIDDLE_FROZEN, CastLinear("second_weight_copy"))
    assert failed(found) == {"waste_saved"}
    assert ("layer 1 (input needs grad, dgrad needed): saved weight_copy [40, 24] 1,920 B, a second copy, 1 "
            "required (a torch.bfloat16 copy of layer 1's frozen weight)") in found["waste_saved"].message


def test_tolerances_come_from_the_gemms_precision_and_still_catch_a_one_percent_lean():
    from planted_backends import LeansOnePercent

    found = verdicts(MIDDLE_FROZEN, LeansOnePercent())
    # bf16 GEMMs: one bf16 rounding (2^-9) is the floor, not fp32's eight (checks.tolerances.truth_bound)
    assert "floor 0.00195 x |truth|" in found["grad_parity"].figures["tolerance"]
    assert {"grad_scale", "grad_parity"} <= failed(found)
    assert "grad of 0.weight leans 1.0100 x its fp64 truth" in found["grad_scale"].message
    assert "grad of 0.weight: error vs the fp64 truth" in found["grad_parity"].message


LLAMA_LORA = model_spec("autocast", ModelConfig(lora_on=LORA_TARGETS["qv"]), True, autocast="bf16")


def test_a_llama_block_through_a_correct_cast_passes():
    found = verdicts(LLAMA_LORA, CastLinear())
    assert failed(found) == set(), [v.message for v in found.values() if not v.ok]


def test_a_second_cast_copy_in_a_llama_block_fails_naming_the_site():
    found = verdicts(LLAMA_LORA, CastLinear("second_weight_copy"))
    assert failed(found) == {"waste_saved"}
    message = found["waste_saved"].message
    assert "site blocks.0.attn.q.base (frozen weight, dgrad needed): saved 2 cast copies of its weight, 1 required" \
        in message
    assert "site blocks.0.mlp.fc_1 (frozen weight, dgrad needed): saved 2 cast copies" in message
