"""The NVFP4 GEMM's per-tensor scale (no TE needed): cuBLAS's alpha is computed by TE's C++ as
common/recipe/nvfp4.cu compute_nvfp4_per_tensor_scale_kernel does, in fp32 left to right:
alpha = alpha_in * amax_A * amax_B * (1.0f / (6 * 6 * 448 * 448)). Hand values: amax 2.5 and 7.25 give
2.5 * 7.25 = 18.125, times fp32(1 / 7225344) = 0x1.50b07ap-19; the product of the two operands' own factors
(amax / 2688 each, the emulation's rule before issue 36) rounds to 0x1.50b078p-19, one ulp off: enough to flip bf16
outputs of TE's NVFP4 Linear dgrad against TE's reference (tests/pytorch/nvfp4/test_nvfp4_module_exact.py)."""
from __future__ import annotations

import torch

from te_verify.te.tecpu import gemm, nvfp4

FP32 = torch.float32
AMAX_A, AMAX_B = torch.tensor(2.5, dtype=FP32), torch.tensor(7.25, dtype=FP32)
ALPHA = float.fromhex("0x1.50b07ap-19")


def one_by_one(amax: torch.Tensor) -> gemm.Operand:
    """A 1x16 NVFP4 operand (one K block) whose block-scaled values are 1, 0, ..., 0, with its amax, as
    block_quantize.gemm_operand gives it: the GEMM of two is 1 times alpha."""
    values = torch.zeros(1, nvfp4.BLOCK, dtype=FP32)
    values[0, 0] = 1.0
    return values, nvfp4.GlobalScale(amax, 448), "NVFP4Quantizer"


def alpha_failures() -> list[str]:
    got = float(gemm.product(one_by_one(AMAX_A), True, one_by_one(AMAX_B), False))
    return [] if got == ALPHA else [f"NVFP4 GEMM alpha {got.hex()}, nvfp4.cu gives {ALPHA.hex()}"]


def test_nvfp4_gemm_scales_by_the_alpha_nvfp4_cu_computes() -> None:
    assert alpha_failures() == []


def test_planted_product_of_the_operands_factors_fails(monkeypatch) -> None:
    """The old rule planted back: each operand's factor (amax / 2688), multiplied; one ulp off here, caught."""
    monkeypatch.setattr(nvfp4, "gemm_alpha", lambda a, b: nvfp4.per_tensor_factor(a) * nvfp4.per_tensor_factor(b))
    assert alpha_failures() == [f"NVFP4 GEMM alpha {float.fromhex('0x1.50b078p-19').hex()}, nvfp4.cu gives "
                                f"{ALPHA.hex()}"]
