"""What every model family shares: seeded draws on the CPU, the dtype table, the case's input and cotangent.

Values are drawn on the CPU from a seeded generator, then moved to the run's device, so a case starts from the
same numbers on every device and every backend; every tensor names its device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from te_verify.spec import CaseSpec

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CPU = torch.device("cpu")  # where the seeded draws happen (the generators are CPU generators)


@dataclass
class CaseInputs:
    """The model input and the cotangent fed to every backward pass."""

    x: torch.Tensor
    grad_output: torch.Tensor


def seeded_linear(fan_in: int, fan_out: int, bias: bool, gen: torch.Generator, dtype: torch.dtype,
                  device: torch.device) -> torch.nn.Linear:
    """nn.Linear with its default init range, drawn from `gen`."""
    layer = torch.nn.Linear(fan_in, fan_out, bias=bias, device=CPU)
    seeded_fill(layer.weight, fan_in ** -0.5, gen)
    if layer.bias is not None:
        seeded_fill(layer.bias, fan_in ** -0.5, gen)
    return layer.to(device=device, dtype=dtype)


def seeded_fill(t: torch.Tensor, bound: float, gen: torch.Generator) -> None:
    """Fill a CPU tensor uniformly in [-bound, bound) from `gen`."""
    with torch.no_grad():
        t.uniform_(-bound, bound, generator=gen)


def seeded_randn(shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype, device: torch.device
                 ) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=CPU).to(device=device, dtype=dtype)


def seeded_model(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Overwrite every parameter of a model built on the CPU by someone else's code (transformers, LitGPT), in
    `named_parameters` order: embeddings N(0, 1), every other matrix uniform in +-fan_in**-0.5 with fan_in its
    second dimension (nn.Linear's default range; a LoRA B of shape (out, r) gets r**-0.5, non-zero as after some
    training, so a backend that mangles A's gradient is seen in the values), vectors (norm scales) ones. The
    library's own init and its draws from the global generator then do not matter."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    with torch.no_grad():
        for _, p in model.named_parameters():
            if id(p) in embeddings:
                p.copy_(torch.randn(p.shape, generator=gen, device=CPU))
            elif p.dim() == 2:
                seeded_fill(p, p.shape[1] ** -0.5, gen)
            else:
                p.fill_(1.0)


def family_inputs(spec: CaseSpec, batch_shape: tuple[int, ...], device: torch.device) -> CaseInputs:
    """A model family's input: token ids with an embedding, else hidden states (needing grad as the spec says); and
    the output cotangent (logits with a head, else hidden states)."""
    gen = torch.Generator(device=CPU).manual_seed(spec.seed + 1)
    dtype, cfg = TORCH_DTYPES[spec.dtype], spec.model
    if cfg.embedding:
        x = torch.randint(cfg.vocab, batch_shape, generator=gen, device=CPU).to(device)
    else:
        x = seeded_randn((*batch_shape, cfg.n_embd), gen, dtype, device).requires_grad_(spec.input_requires_grad)
    return CaseInputs(x, seeded_randn((*batch_shape, cfg.out_width), gen, dtype, device))
