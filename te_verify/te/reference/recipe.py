"""FP8 recipes with TE's names and keyword arguments: Format, DelayedScaling, Float8CurrentScaling."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class Format(enum.Enum):
    """Which FP8 encoding the forward tensors and the gradients use (TE's recipe.Format)."""

    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"  # E4M3 for forward tensors, E5M2 for gradients

    @property
    def fwd_dtype(self) -> torch.dtype:
        return torch.float8_e5m2 if self is Format.E5M2 else torch.float8_e4m3fn

    @property
    def bwd_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if self is Format.E4M3 else torch.float8_e5m2


@dataclass
class DelayedScaling:
    """Per-tensor scale from the amax history of earlier iterations (TE's DelayedScaling defaults)."""

    # Scale is reduced by 2**margin below the value that maps amax onto the FP8 max.
    margin: int = 0
    # FP8 encodings of forward tensors and gradients.
    fp8_format: Format = Format.HYBRID
    # Number of past amax values kept per tensor.
    amax_history_len: int = 1024
    # "max" (of the history) or "most_recent".
    amax_compute_algo: str = "max"
    # All-reduce amax over the data-parallel group (no-op in a single process).
    reduce_amax: bool = True

    def delayed(self) -> bool:
        return True

    def float8_current_scaling(self) -> bool:
        return False


@dataclass
class Float8CurrentScaling:
    """Per-tensor scale from the tensor's own amax at quantization time."""

    # FP8 encodings of forward tensors and gradients.
    fp8_format: Format = Format.HYBRID
    # Scale is reduced by 2**margin (kept for symmetry with DelayedScaling; TE's default is 0).
    margin: int = 0

    def delayed(self) -> bool:
        return False

    def float8_current_scaling(self) -> bool:
        return True


Recipe = DelayedScaling | Float8CurrentScaling
