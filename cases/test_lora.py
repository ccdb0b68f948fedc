"""LoRA adapters on Llama blocks (seeds 001 and 003's PEFT): gradients, outputs and per-site work match eager's."""
from te_verify.matrix.models import lora_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "lora"
LANE = "torch"


def test_lora(case):
    case.verify()
