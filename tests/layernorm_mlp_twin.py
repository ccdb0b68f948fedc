"""TE's LayerNormMLP over the emulation against its definition in torch (layer_norm, fc1, the activation, fc2): the
output and every gradient, the module's parameters copied into the torch twin."""
from __future__ import annotations

from typing import Callable

import torch

NAMES = ("x", "ln_weight", "ln_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")


def seed_parameters(module: torch.nn.Module, scale: float) -> None:
    """Every parameter drawn from a generator seeded by its size, times `scale`."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * scale)


def assert_matches_torch(module: torch.nn.Module, x: torch.Tensor, activation: Callable[[torch.Tensor], torch.Tensor],
                         inspect_fc1: Callable[[torch.Tensor], None] | None = None) -> None:
    """`module` (a LayerNormMLP of hidden x.shape[-1]) on `x` equals layer_norm, fc1, `activation`, fc2 in torch
    within 1e-5, output and every gradient (named on failure). `inspect_fc1` sees fc1's output (to assert what the
    case exercises)."""
    params = [module.layer_norm_weight, module.layer_norm_bias, module.fc1_weight, module.fc1_bias,
              module.fc2_weight, module.fc2_bias]
    xt = x.clone().requires_grad_()
    module(xt).sum().backward()
    ln_w, ln_b, w1, b1, w2, b2 = twins = [p.detach().clone().requires_grad_() for p in params]
    xe = x.clone().requires_grad_()
    hidden = x.shape[-1]
    h = torch.nn.functional.linear(torch.nn.functional.layer_norm(xe, (hidden,), ln_w, ln_b, 1e-5), w1, b1)
    if inspect_fc1 is not None:
        inspect_fc1(h.detach())
    want = torch.nn.functional.linear(activation(h), w2, b2)
    want.sum().backward()
    torch.testing.assert_close(module(x), want, rtol=1e-5, atol=1e-5)
    for name, p, t in zip(NAMES, [xt, *params], [xe, *twins]):
        torch.testing.assert_close(p.grad, t.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
