"""Hugging Face transformers' Llama under peft's LoRA (issue 19): gradients, outputs and per-site work match eager's,
sites named by peft's module paths ("...q_proj.lora_A.default"), the oracle read from the torch.export graph."""
from te_verify.matrix.models import hf_peft_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "hf_peft"
LANE = "torch"


def test_hf_peft(case):
    case.verify()
