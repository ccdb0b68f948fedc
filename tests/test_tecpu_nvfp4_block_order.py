"""The NVFP4 GEMM's accumulation order (no TE needed), from the format's definition as TE's reference GEMM states it
(custom_recipes/reference_nvfp4.py qgemm, "to match the FP4 tensor core implementation"): each output element is an
fp32 accumulator to which the inner products of the 16-long K blocks are added one after another in K order; a
block's inner product is exact (E2M1 times E4M3 block scales). The definition is computed here independently: each
block's product in float64 (exact), rounded to fp32 (still exact), added in K order. Block scales spread over E4M3's
whole range make the order matter: one fp32 matmul over K (the emulation's rule before this test) differs."""
from __future__ import annotations

import torch

from te_verify.te.tecpu import gemm, nvfp4

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E4M3_POSITIVE = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # every finite >= 0


def block_scaled(rows: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """q * s_b: random signed E2M1 elements, one random E4M3 scale per 1x16 block (subnormals to 448)."""
    q = E2M1[torch.randint(0, 8, (rows, k), generator=generator)]
    sign = torch.randint(0, 2, (rows, k), generator=generator) * 2 - 1
    scales = E4M3_POSITIVE[torch.randint(0, 127, (rows, k // nvfp4.BLOCK), generator=generator)]
    return q * sign * scales.repeat_interleave(nvfp4.BLOCK, 1)


def by_definition(b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(b.shape[0], a.shape[1])
    for start in range(0, b.shape[1], nvfp4.BLOCK):
        block = b[:, start:start + nvfp4.BLOCK].double() @ a[start:start + nvfp4.BLOCK].double()
        out += block.float()
    return out


def operands() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return block_scaled(64, 512, generator), block_scaled(48, 512, generator).t().contiguous()


def order_failures(product) -> list[str]:
    b, a = operands()
    got, want = product(b, a), by_definition(b, a)
    wrong = int((got != want).sum())
    return [f"{wrong} of {want.numel()} outputs differ from the block-ordered sum"] if wrong else []


def test_nvfp4_gemm_adds_block_products_in_k_order() -> None:
    assert order_failures(nvfp4.block_ordered_matmul) == []


def test_tex_gemm_product_uses_the_block_order() -> None:
    b, a = operands()
    one = nvfp4.GlobalScale(torch.ones((), dtype=torch.float32), 448)
    alpha = nvfp4.gemm_alpha(one, one)
    got = gemm.product((a, one, "NVFP4Quantizer"), False, (b, one, "NVFP4Quantizer"), False)
    assert torch.equal(got, by_definition(b, a) * alpha)


def test_planted_one_matmul_over_k_fails() -> None:
    """The rule before: one fp32 matmul over the whole K sums in its own order; caught."""
    failures = order_failures(lambda b, a: b @ a)
    assert len(failures) == 1 and "differ from the block-ordered sum" in failures[0]
