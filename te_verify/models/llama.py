"""The Llama family, as LitGPT builds a block: RMSNorm, q/k/v/o projections around causal scaled-dot-product
attention, a SwiGLU MLP (fc_1, fc_2, proj), residuals; optional token embedding in front and norm + LM head
behind; LoRA adapters on any projection. No biases (Llama has none) and no rotary embedding (elementwise, no
linear site; left out to keep the cases small).

Written to trace with torch.fx (no Python reads of shapes), so the oracle reads its module graph.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from te_verify.models import stages
from te_verify.models.lora import LoRALinear, is_adapter
from te_verify.models.recompute import run_block
from te_verify.models.seeded import CPU, TORCH_DTYPES, family_inputs, seeded_linear
from te_verify.spec import CaseSpec, ModelConfig


class RMSNorm(torch.nn.Module):
    """LitGPT's RMSNorm: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size, dtype=dtype, device=device))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        return x * torch.rsqrt(norm_x + self.eps) * self.weight


class Projections:
    """Makes the block's linears: plain, or LoRA over a base (torch.nn.Linear, or TE's Linear via `te_linear`)."""

    def __init__(self, cfg: ModelConfig, gen: torch.Generator, dtype: torch.dtype, device: torch.device,
                 te_linear=None) -> None:
        self.cfg, self.gen, self.dtype, self.device, self.te_linear = cfg, gen, dtype, device, te_linear

    def __call__(self, name: str, fan_in: int, fan_out: int) -> torch.nn.Module:
        base = seeded_linear(fan_in, fan_out, False, self.gen, self.dtype, self.device)
        if name not in self.cfg.lora_on:
            return base
        if self.te_linear is not None:
            base = self.te_linear(base)
        return LoRALinear(base, fan_in, fan_out, self.cfg.lora_rank, self.cfg.lora_alpha, self.gen, self.dtype,
                          self.device)


class Attention(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, make: Projections) -> None:
        super().__init__()
        c = cfg.n_embd
        self.q, self.k, self.v, self.o = (make(n, c, c) for n in ("q", "k", "v", "o"))
        self.heads = (cfg.n_head, c // cfg.n_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Three plain calls, no generator: thunder's interpreter takes seconds over a generator expression.
        q = self.q(x).unflatten(-1, self.heads).transpose(1, 2)
        k = self.k(x).unflatten(-1, self.heads).transpose(1, 2)
        v = self.v(x).unflatten(-1, self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).flatten(-2))


class MLP(torch.nn.Module):
    """LitGPT's LLaMAMLP: proj(silu(fc_1(x)) * fc_2(x))."""

    def __init__(self, cfg: ModelConfig, make: Projections) -> None:
        super().__init__()
        self.fc_1 = make("fc_1", cfg.n_embd, cfg.intermediate)
        self.fc_2 = make("fc_2", cfg.n_embd, cfg.intermediate)
        self.proj = make("proj", cfg.intermediate, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.fc_1(x)) * self.fc_2(x))


class Block(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, make: Projections, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.norm_1 = RMSNorm(cfg.n_embd, dtype, device)
        self.attn = Attention(cfg, make)
        self.norm_2 = RMSNorm(cfg.n_embd, dtype, device)
        self.mlp = MLP(cfg, make)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x))
        return x + self.mlp(self.norm_2(x))


class Llama(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, make: Projections, dtype: torch.dtype, device: torch.device,
                 recompute: str = "none") -> None:
        super().__init__()
        self.recompute = recompute  # CaseSpec.recompute: each block checkpointed (models.recompute)
        if cfg.embedding:
            self.wte = torch.nn.Embedding(cfg.vocab, cfg.n_embd, device=CPU)
            torch.nn.init.normal_(self.wte.weight, generator=make.gen)
            self.wte.to(device=device, dtype=dtype)
        self.blocks = torch.nn.ModuleList(Block(cfg, make, dtype, device) for _ in range(cfg.blocks))
        if cfg.head:
            self.ln_f = RMSNorm(cfg.n_embd, dtype, device)
            self.lm_head = seeded_linear(cfg.n_embd, cfg.vocab, False, make.gen, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "wte"):
            x = self.wte(x)
        for block in self.blocks:
            x = run_block(self.recompute, block, x)
        if hasattr(self, "lm_head"):
            x = self.lm_head(self.ln_f(x))
        return x


def build(spec: CaseSpec, device: torch.device, te_linear=None) -> Llama:
    """The seeded model, every parameter trainable; `te_linear` turns an adapter's base into a TE Linear."""
    gen = torch.Generator(device=CPU).manual_seed(spec.seed)
    dtype = TORCH_DTYPES[spec.dtype]
    return Llama(spec.model, Projections(spec.model, gen, dtype, device, te_linear), dtype, device, spec.recompute)


make_inputs = family_inputs  # token ids or hidden states, and the output cotangent


def stage_of(name: str) -> tuple[str, int | None]:
    """A parameter's stage and block (te_verify.models.stages) from its qualified name."""
    if name.startswith("wte."):
        return "embedding", None
    if name.startswith(("ln_f.", "lm_head.")):
        return "head", None
    block = stages.block_of(name, "blocks.")
    if ".norm_" in name:
        return "norms", block
    return ("adapter" if is_adapter(name) else "linear"), block


def trainable(name: str, cfg: ModelConfig) -> bool:
    """The family's freezing rule for one parameter (qualified name)."""
    return stages.rule(*stage_of(name), cfg)


def set_frozen(model: torch.nn.Module, cfg: ModelConfig) -> None:
    stages.set_frozen(model, cfg, trainable)


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks in order (what a sharded wrapper wraps one by one)."""
    return list(model.blocks)
