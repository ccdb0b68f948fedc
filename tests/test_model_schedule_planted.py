"""Freeze schedules on a model family (issue 34, item 3): what a change means for a family's groups of parameters
(models.stages.changed), the spec's refusals, and the checks after a change on our Llama block with LoRA: a
callable built for the requires_grad flags of prepare and reused after LoRA's phase switch (the adapters frozen, the
base projections trained) misses the base weights' gradients, named; its clean twin, written differently from eager
(torch.func.functional_call), passes."""
from __future__ import annotations

import pytest

from planted_schedule import RereadsRequiresGrad, StaleRequiresGrad
from te_verify.checks.verdict import CheckFailures
from te_verify.matrix.models import LORA_TARGETS, model_spec
from te_verify.models import new_state_bytes, spec_at
from te_verify.models.stages import trains_at
from te_verify.run.caserun import CaseRun
from te_verify.spec import CaseSpec, ModelConfig, SpecError

LORA = ModelConfig(lora_on=LORA_TARGETS["qv"])
PHASE = model_spec("schedule", LORA, True, schedule=((2, "swap"),))
UNFREEZE = model_spec("schedule", LORA, schedule=((2, "unfreeze_all"), (3, "freeze_adapters")))


def test_groups_per_iteration_fold_the_changes():
    assert trains_at(PHASE, 1) == ("norms", "norms.0", "adapter.0")  # PEFT's rule: adapters and norms
    assert trains_at(PHASE, 2) == ("linear.0",)  # the phase switch: the base projections alone
    assert trains_at(UNFREEZE, 2) == ("norms", "norms.0", "linear.0", "adapter.0")
    assert trains_at(UNFREEZE, 3) == ("norms", "norms.0", "linear.0")
    head = model_spec("schedule", ModelConfig(lora_on=("q",), embedding=True, head=True),
                      schedule=((2, "freeze_all_but_last"),))
    assert trains_at(head, 2) == ("head",)
    assert spec_at(PHASE, 1) is PHASE
    at2 = spec_at(PHASE, 2)
    assert at2.model.trains == ("linear.0",) and not at2.schedule and "-tr_linear.0-" in at2.id
    assert CaseSpec.from_dict(at2.to_dict()) == at2
    # iteration 2's step makes momentum for the block's seven projection weights (32x32 x4, 32x64 x2, 64x32), fp32
    assert new_state_bytes(PHASE, 2) == 4 * (4 * 32 * 32 + 3 * 32 * 64)


@pytest.mark.parametrize("model, schedule, names", [
    (LORA, ((2, "bias_only"),), "no biases"),
    (LORA, ((2, "freeze_all_but_last"),), "model.head is False"),
    (ModelConfig(), ((2, "freeze_adapters"),), "needs adapters"),
    (ModelConfig(lora_on=("q",), te_base=True), ((2, "swap"),), "torch lane"),
    (ModelConfig(lora_on=("q",), trains=("adapter.0",)), ((2, "swap"),), "^model.trains=.*starts from"),
])
def test_spec_refuses_family_schedules_naming_the_field(model, schedule, names):
    with pytest.raises(SpecError, match=names):
        model_spec("schedule", model, schedule=schedule)


def test_spec_refuses_unknown_groups_and_adapters_on_a_stack():
    with pytest.raises(SpecError, match=r"^model.trains=\('linear.1',\): expected distinct groups"):
        model_spec("schedule", ModelConfig(trains=("linear.1",)))
    with pytest.raises(SpecError, match="'freeze_adapters' needs a model family's adapters"):
        CaseSpec("schedule", (8, 8), (False,), schedule=((2, "freeze_adapters"),))


def test_callable_reused_after_a_phase_switch_misses_the_base_gradients():
    with pytest.raises(CheckFailures) as info:
        CaseRun(PHASE, "stale", StaleRequiresGrad()).verify()
    message = str(info.value)
    # grad_presence, at the change: every base projection newly trainable, named
    assert "blocks.0.attn.q.base.weight: gradient is None after iteration 2, expected a gradient (trainable)" in message
    assert "blocks.0.mlp.proj.weight: gradient is None after iteration 2" in message
    assert "after pass 1" not in message  # iteration 1 (before the change) is right


def test_clean_twin_reading_requires_grad_every_call_passes():
    verdicts = {v.check: v for v in CaseRun(UNFREEZE, "rereads", RereadsRequiresGrad()).verify()}
    assert verdicts["grad_parity"].figures["iterations_compared"] == 3
    assert verdicts["grad_presence"].figures["presence_points_compared"] == 3
    assert verdicts["params_after_steps"].figures["steps_compared"] == 3
    assert verdicts["memory_retained"].ok
