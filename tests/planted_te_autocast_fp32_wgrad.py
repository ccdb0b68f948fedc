"""A planted TE build for FP8 under torch.autocast: te_verify.te.reference's API, whose `Linear` keeps its wgrad GEMM's
fp32 sum where TE's emits the activation dtype (bf16 under autocast, linear.py `wgrad_gemm_kwargs["out_dtype"]`).
Used as `--te-impl planted_te_autocast_fp32_wgrad`."""
from __future__ import annotations

from te_verify.te.reference import (DelayedScaling, Float8CurrentScaling, Format, GroupedLinear,  # noqa: F401
                                    autocast, fp8_autocast, is_fp8_available)
from te_verify.te.reference import Linear as ReferenceLinear


class Linear(ReferenceLinear):
    """te.reference's Linear, its wgrad returned in fp32."""

    wgrad_in_activation_dtype = False
