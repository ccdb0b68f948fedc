"""FP8 emulation per tensor: quantize with torch's float8 casts (saturating), dequantize, scale from amax.

The GEMM itself runs in fp32 on dequantized operands, so the only FP8 effect is the rounding of the
quantize step, which is exactly torch's cast of the scaled, saturated value.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from te_verify.te.reference.recipe import Recipe

from te_verify.te.fp8 import FP8_MAX, dequantize, fp8_dims_ok, quantize  # noqa: F401  (re-exported)


def scale_from_amax(amax: torch.Tensor, fp8_max: float, margin: int, previous: torch.Tensor) -> torch.Tensor:
    """TE's rule: (fp8_max / amax) / 2**margin; keep the previous scale when amax is 0 or not finite."""
    scale = (torch.tensor(fp8_max, dtype=amax.dtype, device=amax.device) / amax) / (2.0 ** margin)
    keep = (amax <= 0) | ~torch.isfinite(amax) | ~torch.isfinite(scale)
    return torch.where(keep, previous, scale)


@dataclass
class Float8Tensor:
    """FP8 data and the inverse scale it was quantized with (what TE saves for backward)."""

    # The float8 payload (1 byte per element).
    data: torch.Tensor
    # 1/scale used at quantization, fp32 0-d tensor.
    scale_inv: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        return dequantize(self.data, self.scale_inv)

    def backward_copy(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The copy backward's GEMMs read: per tensor, the same one (block_recipe.BlockCopy has two)."""
        return self.data, self.scale_inv

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale_inv.element_size()


class TensorScaler:
    """The scaling state of one tensor slot of one layer (input, weight or grad_output)."""

    def __init__(self, recipe: Recipe, dtype: torch.dtype, device: torch.device) -> None:
        self.recipe = recipe
        self.dtype = dtype
        self.scale = torch.ones((), dtype=torch.float32, device=device)
        history = recipe.amax_history_len if recipe.delayed() else 1
        self.amax_history = torch.zeros(history, dtype=torch.float32, device=device)

    def quantize(self, x: torch.Tensor) -> Float8Tensor:
        amax = x.detach().abs().max().float() if x.numel() else torch.zeros((), device=x.device)
        if not self.recipe.delayed():
            self.scale = scale_from_amax(amax, FP8_MAX[self.dtype], self.recipe.margin,
                                         torch.ones((), device=x.device))
        self.amax_history[0] = torch.maximum(self.amax_history[0], amax)
        scale = self.scale.clone()
        return Float8Tensor(quantize(x, scale, self.dtype), scale.reciprocal())

    def update(self) -> None:
        """Delayed scaling: new scale from the history, then roll it (the slot for the next step is zeroed)."""
        if not self.recipe.delayed():
            return
        if self.recipe.amax_compute_algo == "most_recent":
            amax = self.amax_history[0]
        else:
            amax = self.amax_history.max()
        self.scale = scale_from_amax(amax, FP8_MAX[self.dtype], self.recipe.margin, self.scale)
        self.amax_history = torch.roll(self.amax_history, 1)
        self.amax_history[0] = 0.0


def assert_fp8_dims(t: torch.Tensor) -> None:
    """Raise as TE's assert_dim_for_fp8_exec does (AssertionError) for shapes FP8 GEMMs refuse."""
    assert fp8_dims_ok(tuple(t.shape)), (
        "FP8 execution requires 2D input matrices with height divisible by 8 and width divisible by 16, "
        f"but got tensor with dims={list(t.shape)}")
