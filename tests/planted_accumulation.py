"""A correct implementation written differently from eager: every torch.nn.Linear as `matmul` then a separate bias
add (the same math, another accumulation order: the bias joins after the product is rounded, and matmul takes
another kernel path for 3-D inputs), as a cuBLAS or TE GEMM on a GPU differs from eager's. It must pass every case
(tests/test_tolerances.py); `--backend planted_accumulation:OtherAccumulation`."""
from __future__ import annotations

import types

import torch


def _matmul_then_bias(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    out = torch.matmul(x, self.weight.t())
    return out + self.bias if self.bias is not None else out


class OtherAccumulation:
    name = "other_accumulation"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec):
        for module in model.modules():
            if type(module) is torch.nn.Linear:
                module.forward = types.MethodType(_matmul_then_bias, module)
        return model
