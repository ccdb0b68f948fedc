"""LitGPT's litgpt.lora.GPT (issue 19): gradients, outputs and per-site work match eager's, its adapter Parameters
(`x @ lora_A.T @ lora_B.T`, the fused qkv's grouped conv1d) counted as the linear sites they are."""
from te_verify.matrix.models import litgpt_lora_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "litgpt_lora"
LANE = "torch"


def test_litgpt_lora(case):
    case.verify()
