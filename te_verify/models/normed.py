"""A linear layer after a layer norm: the torch twin of TE's LayerNormLinear (spec.te.module "layernorm_linear"),
and with a linear after an activation, of TE's LayerNormMLP (spec.te.module "layernorm_mlp": NormedLinear is fc1,
ActivatedLinear fc2).

`NormedLinear` is a torch.nn.Linear (so it is its stack layer's linear site, named as Linear layers are) with a
LayerNorm child "norm" applied to its input: y = linear(layer_norm(x)). The norm's scale and shift are drawn from
the case's generator after every linear (the draws of the other kinds are unchanged) and are frozen with the layer's
bias (with its weight where the stack has no biases): BitFit-style cases train norms beside biases, and a trained
weight beside a frozen norm and bias is a case where the layer's input needs no gradient although its weight does.
"""
from __future__ import annotations

import torch

from te_verify.models.seeded import CPU, seeded_fill
from te_verify.spec import NORM_MODULES  # noqa: F401  (spec.te.module values whose layers are NormedLinear)
EPS = 1e-5  # torch's and TE's default layer-norm epsilon
QGELU_ALPHA = 1.702  # TE's quick GELU: x * sigmoid(1.702 x)

# TE's activations (spec.MLP_ACTIVATIONS) written in torch from their definitions (TE's common/util/math.h): gelu is
# the tanh approximation, srelu the squared ReLU.
ACTIVATIONS = {
    "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "relu": torch.nn.functional.relu,
    "srelu": lambda x: torch.nn.functional.relu(x).square(),
    "qgelu": lambda x: x * torch.sigmoid(QGELU_ALPHA * x),
    "silu": torch.nn.functional.silu,
}


class NormedLinear(torch.nn.Linear):
    """layer_norm(x) over the in-features, then this Linear."""

    def __init__(self, fan_in: int, fan_out: int, bias: bool) -> None:
        super().__init__(fan_in, fan_out, bias=bias, device=CPU)
        self.norm = torch.nn.LayerNorm(fan_in, eps=EPS, device=CPU)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.norm(x))


class ActivatedLinear(torch.nn.Linear):
    """activation(x), then this Linear: an MLP's fc2 (its fc1 the NormedLinear before it)."""

    def __init__(self, fan_in: int, fan_out: int, bias: bool, activation: str) -> None:
        super().__init__(fan_in, fan_out, bias=bias, device=CPU)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(ACTIVATIONS[self.activation](x))


def activated(layer: torch.nn.Linear, activation: str) -> ActivatedLinear:
    """`layer`'s Parameters behind `activation` (no draws)."""
    out = ActivatedLinear(layer.in_features, layer.out_features, layer.bias is not None, activation)
    out.weight, out.bias = layer.weight, layer.bias
    return out.to(device=layer.weight.device, dtype=layer.weight.dtype)


def normed(layer: torch.nn.Linear, gen: torch.Generator) -> NormedLinear:
    """`layer`'s Parameters behind a LayerNorm whose scale (around 1) and shift are drawn from `gen`."""
    out = NormedLinear(layer.in_features, layer.out_features, layer.bias is not None)
    out.weight, out.bias = layer.weight, layer.bias
    seeded_fill(out.norm.weight, 0.5, gen)
    with torch.no_grad():
        out.norm.weight.add_(1.0)
    seeded_fill(out.norm.bias, 0.5, gen)
    return out.to(device=layer.weight.device, dtype=layer.weight.dtype)


def freeze_norm(layer: torch.nn.Module, frozen: bool) -> None:
    """A NormedLinear's norm frozen or trained (nothing for other layers)."""
    if isinstance(layer, NormedLinear):
        layer.norm.requires_grad_(not frozen)
