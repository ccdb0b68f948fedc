"""Correct implementations written differently from eager. `OtherAccumulation`: every torch.nn.Linear as `matmul` then
a separate bias add (the same math, another accumulation order: the bias joins after the product is rounded, and
matmul takes another kernel path for 3-D inputs), as a cuBLAS or TE GEMM on a GPU differs from eager's. It must pass
every case (tests/test_tolerances.py); `--backend planted_accumulation:OtherAccumulation`. `Fp64Inside`: every
torch.nn.Linear computed in fp64 and cast back; its values must pass every case (tests/test_systematic_planted.py),
its fp64 copies are more saved bytes and peak than the oracle's (waste_saved, waste_peak)."""
from __future__ import annotations

import types

import torch


def _matmul_then_bias(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    out = torch.matmul(x, self.weight.t())
    return out + self.bias if self.bias is not None else out


def _in_fp64(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    bias = self.bias.double() if self.bias is not None else None
    return torch.nn.functional.linear(x.double(), self.weight.double(), bias).to(x.dtype)


class OtherAccumulation:
    name = "other_accumulation"
    # What every torch.nn.Linear of the model computes instead of its own forward.
    linear_forward = staticmethod(_matmul_then_bias)

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec):
        for module in model.modules():
            if type(module) is torch.nn.Linear:
                module.forward = types.MethodType(self.linear_forward, module)
        return model


class Fp64Inside(OtherAccumulation):
    """Every torch.nn.Linear computed in fp64 and cast back (its dgrad and wgrad too, by autograd's casts): a correct
    implementation more accurate than eager; `--backend planted_accumulation:Fp64Inside`."""

    name = "fp64_inside"
    linear_forward = staticmethod(_in_fp64)
