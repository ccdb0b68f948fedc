"""te_fp8's pr case under TE's default NVFP4BlockScaling (stochastic rounding of gradients) at emulated sm100, run
through the lane's own pytest family clean and with planted faults, in one interpreter booted at sm100. Prints one
JSON line: {run: {backend: {check: status}}}.

- clean: the emulation's stochastic rounding (te_eager and thunder_te);
- other_draw: stochastic rounding from another generator (a correct implementation drawing other bits), te_eager;
- always_down: the random bits all 0: every element rounds down to its lower E2M1 neighbour (biased);
- beyond_neighbour: an element rounded up goes one E2M1 value further (off its two neighbours; not in the default
  runs: tests/test_nvfp4_sr.py plants it at the check);
- wgrad_off: every wgrad GEMM (layout NT) 5% high, the stochastic rounding correct.
"""
from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from planting import patched
from te_verify.te.tecpu import block_quantize, boot, nvfp4

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"clean": ("te_eager", "thunder_te"), "other_draw": ("te_eager",), "always_down": ("te_eager",),
        "beyond_neighbour": ("te_eager",), "wgrad_off": ("te_eager",)}
DEFAULT_RUNS = ("clean", "other_draw", "always_down", "wgrad_off")


def _other_draw():
    generator = torch.Generator().manual_seed(2026)
    return patched(block_quantize, "random_bytes", lambda original: lambda shape: torch.randint(
        0, 256, shape, generator=generator, dtype=torch.uint8))


def _beyond_neighbour():
    def wrap(original):
        def encode(x, random_bytes):
            codes = original(x, random_bytes)
            up = nvfp4.decode(codes).abs() > x.abs()
            magnitude = codes & 7
            return torch.where(up & (magnitude < 7), codes + 1, codes).to(torch.uint8)
        return encode
    return patched(nvfp4, "encode_stochastic", wrap)


def _wgrad_off():
    tex = sys.modules["transformer_engine_torch"]

    def wrap(original):
        def generic_gemm(A, transA, B, transB, *args, **kwargs):
            out = original(A, transA, B, transB, *args, **kwargs)
            if not transA and transB:
                out[0].mul_(1.05)
            return out
        return generic_gemm
    return patched(tex, "generic_gemm", wrap)


FAULTS = {"clean": contextlib.nullcontext, "other_draw": _other_draw,
          "always_down": lambda: patched(block_quantize, "random_bytes",
                                         lambda original: lambda shape: torch.zeros(shape, dtype=torch.uint8)),
          "beyond_neighbour": _beyond_neighbour, "wgrad_off": _wgrad_off}


def run(name: str, report: Path) -> dict:
    backends = RUNS[name]
    select = " or ".join(backends)
    with FAULTS[name]():
        pytest.main(["cases/test_te_fp8.py", "--tier", "pr", "--te-capability", "sm100", "-p", "no:cacheprovider",
                     "-q", "-n", "0", "-k", f"fp8nvfp4-sm100] and ({select})", "--report-dir", str(report)])
    rows = [json.loads(line) for line in (report / "rows.jsonl").read_text().splitlines()]
    return {r["backend"]: r.get("checks", {}) for r in rows if r.get("kind") == "row"}


def main(names: list[str]) -> None:
    boot("sm100")
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps({name: run(name, Path(tmp) / name) for name in names}))


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT_RUNS))
