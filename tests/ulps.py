"""An elementwise bound in fp32 ulps, for the emulated kernels' exactness tests (a kernel rounds each of its
operations once; a definition in float64 lands within a few ulps of the magnitudes involved)."""
from __future__ import annotations

import torch

F32_ULP = 2.0 ** -23


def assert_close_ulps(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor, ulps: float, what: str) -> None:
    """|got - want| <= ulps fp32 ulps of `scale` elementwise; the message names the worst element."""
    err = (got.double() - want).abs()
    bound = ulps * F32_ULP * scale
    worst = int(torch.argmax(err - bound))
    assert bool((err <= bound).all()), (f"{what}: element {worst} is {got.reshape(-1)[worst].item()!r}, the definition "
                                        f"{want.reshape(-1)[worst].item()!r} (beyond {ulps} fp32 ulps)")
