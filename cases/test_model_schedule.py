"""Freeze schedules on the model families (issue 34, item 3): the trainable set of transformers' Llama under peft's
LoRA, LitGPT's LoRA GPT and our Llama block changes between iterations (LoRA's phase switch, unfreezing, the adapters
frozen, the head alone); gradients, None-ness, parameters (a newly frozen one bitwise) and the per-site work judged
after every change as after every step, against the oracle of the parameters training then (models.schedule.spec_at)."""
from te_verify.matrix.model_schedule import model_schedule_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "model_schedule"
LANE = "torch"


def test_model_schedule(case):
    case.verify()
