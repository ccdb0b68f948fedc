"""What a thunder compilation costs here, and what it scales with: module calls, not linears or FLOPs.

Times `thunder.jit(model)(x)` plus one backward (a fresh ThunderModule each time, as every case does; best of
`--repeats`) for: N linears called as N nn.Linear modules, the same N linears each wrapped in one more module,
N `F.linear` calls on parameters of one module, and the Llama families' one-block models the pr tier runs.
Prints the seconds per compilation and the cost per module call derived from the first two rows.

    .venv/bin/python scripts/bench_thunder.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import platform
import time
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from te_verify.compat.thunder import import_thunder
from te_verify.matrix.models import LORA_TARGETS, model_spec
from te_verify.models import llama
from te_verify.spec import ModelConfig

WIDTH = 32


class Wrapped(torch.nn.Module):
    """One more module call around a linear."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class FunctionalStack(torch.nn.Module):
    """N linears as F.linear calls on this module's own parameters: one module call in all."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(WIDTH, WIDTH)) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = F.linear(x, w)
        return x


def compile_seconds(thunder, make: Callable[[], torch.nn.Module], x: torch.Tensor, repeats: int) -> float:
    """Best wall time of jit + forward + backward on a freshly built model."""
    best = float("inf")
    for _ in range(repeats):
        model, inp = make(), x.detach().requires_grad_()
        start = time.perf_counter()
        thunder.jit(model)(inp).sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


def llama_rows(thunder, repeats: int) -> list[tuple[str, float]]:
    rows = []
    for name, cfg in (("llama block, no LoRA", ModelConfig()),
                      ("llama block, LoRA on q, v", ModelConfig(lora_on=LORA_TARGETS["qv"])),
                      ("llama block, LoRA on every projection", ModelConfig(lora_on=LORA_TARGETS["all"]))):
        spec = model_spec("lora", cfg, True)
        modules = sum(1 for _ in llama.build(spec, torch.device("cpu")).modules())
        x = torch.randn(*spec.batch_shape, cfg.in_width)
        seconds = compile_seconds(thunder, lambda: llama.build(spec, torch.device("cpu")), x, repeats)
        rows.append((f"{name} ({modules} modules)", seconds))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    thunder = import_thunder()
    x = torch.randn(4, WIDTH)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"torch {torch.__version__}, thunder {thunder.__version__}")
    per_call = []
    for n in (4, 8, 16):
        plain = compile_seconds(thunder, lambda: torch.nn.Sequential(
            *[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(n)]), x, args.repeats)
        wrapped = compile_seconds(thunder, lambda: torch.nn.Sequential(
            *[Wrapped(torch.nn.Linear(WIDTH, WIDTH, bias=False)) for _ in range(n)]), x, args.repeats)
        functional = compile_seconds(thunder, lambda: FunctionalStack(n), x, args.repeats)
        per_call.append((wrapped - plain) / n)
        print(f"{n:2d} linears: {plain:.2f} s as nn.Linear modules, {wrapped:.2f} s each wrapped in one more module, "
              f"{functional:.2f} s as F.linear calls in one module")
    print(f"one more module call costs {min(per_call):.3f}-{max(per_call):.3f} s of compilation")
    for name, seconds in llama_rows(thunder, args.repeats):
        print(f"{name}: {seconds:.2f} s")


if __name__ == "__main__":
    main()
