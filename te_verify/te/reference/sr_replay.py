"""A run's stochastic rounding, replayed by the same-quantization reference (block_recipe.replaying).

No reference can draw TE's random bits, but each stochastic quantization's choices (which elements went to the
upper E2M1 neighbour of their scaled value) are read off what it stored (checks.nvfp4_sr.rounding_choices, after the
check holds them to stochastic rounding's contract). The reference applies them to its own values with its own
scales, so its gradients are those of the same draw: a run whose values or GEMMs go wrong still differs from it,
while the choices, a correct draw's coin flips, carry nothing of the run's values. An element whose reference value
lies in another E2M1 interval than the run's (its source differs by accumulation noise) rounds by the same choice
within its own interval, as an element near a midpoint may round otherwise under rounding to nearest.

Which quantization a reference call replays: the unused one of the same shape whose source is nearest its own
(normwise), the first on ties (a replayed backward quantizes equal gradients once per pass, in order). The TE
families run no warm-up, whose quantizations the observer would not see.
"""
from __future__ import annotations

import torch


class RoundingReplay:
    """The choices of a run's stochastic quantizations (checks.nvfp4_sr.Choices), each replayed once."""

    def __init__(self, choices: list) -> None:
        self.choices_left = list(choices)

    def choices(self, x2d: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(rowwise, columnwise) choices of the run's quantization this reference quantization of x2d replays."""
        shape = tuple(x2d.shape)
        candidates = [c for c in self.choices_left if not c.used and tuple(c.source.shape) == shape]
        if not candidates:
            raise ValueError(f"the same-quantization reference quantizes a {shape} gradient stochastically where the "
                             f"run made no stochastic quantization of that shape left to replay")
        x = x2d.detach().to("cpu", torch.float64)
        distances = torch.stack([torch.linalg.vector_norm(c.source.double() - x) for c in candidates])
        chosen = candidates[int(torch.argmin(distances))]
        chosen.used = True
        device = x2d.device
        return tuple(None if up is None else up.to(device) for up in (chosen.up_row, chosen.up_col))
