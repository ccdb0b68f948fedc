"""A `--te-impl` variant of the reference that frees saved state after the first backward, as real TE does
(TE issue 990): a second `backward(retain_graph=True)` raises AttributeError. Same API as the reference.
"""
from __future__ import annotations

from te_verify.reference import grouped, grouped_mlp, linear
from te_verify.reference import (  # noqa: F401  (re-exported: the API subset)
    DelayedScaling, Float8CurrentScaling, Format, autocast, fp8_autocast, get_dummy_wgrad, is_fp8_available,
)

FREE_SAVED_AFTER_BACKWARD = True


class Linear(linear.Linear):
    free_saved_after_backward = True


class GroupedLinear(grouped.GroupedLinear):
    free_saved_after_backward = True


class GroupedMLP(grouped_mlp.GroupedMLP):
    free_saved_after_backward = True
