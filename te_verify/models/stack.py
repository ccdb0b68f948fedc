"""The linear-stack family: torch.nn.Linear layers (or Experts of them) named "0", "1", ..., frozen by mask."""
from __future__ import annotations

from typing import Iterable

import torch

from te_verify.models.normed import NORM_MODULES, activated, freeze_norm, normed
from te_verify.models.recompute import CheckpointedStack
from te_verify.models.seeded import CPU, TORCH_DTYPES, CaseInputs, seeded_linear, seeded_randn
from te_verify.spec import MLP_MODULES, CaseSpec


class Experts(torch.nn.Module):
    """One MoE layer without routing: expert k ("e<k>") multiplies the k-th equal share of the rows.

    `frozen_experts` are kept frozen by set_frozen whatever the layer's mask says (MoE PEFT)."""

    def __init__(self, experts: list[torch.nn.Linear], frozen_experts: tuple[int, ...]) -> None:
        super().__init__()
        for k, expert in enumerate(experts):
            self.add_module(f"e{k}", expert)
        self.frozen_experts = frozen_experts

    @property
    def experts(self) -> list[torch.nn.Linear]:
        return list(self.children())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        chunks = rows.chunk(len(self.experts))
        out = torch.cat([expert(chunk) for expert, chunk in zip(self.experts, chunks)])
        return out.reshape(*x.shape[:-1], -1)


def build(spec: CaseSpec, device: torch.device) -> torch.nn.Sequential:
    """A stack of torch.nn.Linear layers (or Experts of them) named "0", "1", ...; weights drawn from
    `spec.seed`, all trainable, on `device`; its blocks checkpointed as `spec.recompute` says."""
    gen = torch.Generator(device=CPU).manual_seed(spec.seed)
    dtype = TORCH_DTYPES[spec.dtype]
    experts = spec.te.experts if spec.te is not None else 1
    layers = []
    for fan_in, fan_out in zip(spec.widths, spec.widths[1:]):
        group = [seeded_linear(fan_in, fan_out, spec.has_bias, gen, dtype, device) for _ in range(experts)]
        layers.append(group[0] if experts == 1 else Experts(group, spec.te.frozen_experts))
    if spec.te is not None and spec.te.module in NORM_MODULES:  # drawn after every linear: their draws unchanged
        layers = [normed(layer, gen) for layer in layers]
    if spec.te is not None and spec.te.module in MLP_MODULES:  # per pair: fc1 behind a norm, fc2 behind the activation
        layers = [normed(layer, gen) if i % 2 == 0 else activated(layer, spec.te.activation)
                  for i, layer in enumerate(layers)]
    for i in (spec.te.tied[1:] if spec.te is not None else ()):
        layers[i].weight = layers[spec.te.tied[0]].weight  # tied: one Parameter, used by every listed layer
    if spec.recompute != "none":
        return CheckpointedStack(layers, spec.recompute)
    return torch.nn.Sequential(*layers)


def make_inputs(spec: CaseSpec, batch_shape: tuple[int, ...], device: torch.device) -> CaseInputs:
    """The input (needing grad as the spec says) and the output cotangent."""
    gen = torch.Generator(device=CPU).manual_seed(spec.seed + 1)
    dtype = TORCH_DTYPES[spec.dtype]
    x = seeded_randn((*batch_shape, spec.widths[0]), gen, dtype, device)
    grad_output = seeded_randn((*batch_shape, spec.widths[-1]), gen, dtype, device)
    return CaseInputs(x.requires_grad_(spec.input_requires_grad), grad_output)


def set_frozen(layers: Iterable[torch.nn.Module], weight_frozen: tuple[bool, ...],
               bias_frozen: tuple[bool, ...] | None) -> None:
    """Apply freeze masks to linear layers, in order (a built model iterates its layers; wrappers expose theirs); a
    layer's norm (models.normed) follows its bias mask, or its weight mask without biases."""
    for i, layer in enumerate(layers):
        freeze_norm(layer, (bias_frozen if bias_frozen is not None else weight_frozen)[i])
        for k, linear in enumerate(getattr(layer, "experts", [layer])):
            frozen_expert = k in getattr(layer, "frozen_experts", ())
            linear.weight.requires_grad_(not (weight_frozen[i] or frozen_expert))
            if bias_frozen is not None and getattr(linear, "bias", None) is not None:
                linear.bias.requires_grad_(not (bias_frozen[i] or frozen_expert))
