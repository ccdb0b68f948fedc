"""What TE's own tests (test_recipe.py, run over the emulation by scripts/te_own_tests.py) showed missing, each from
its definition:
- `tex.FP8TensorMeta` (csrc/common.h, bound in extensions/pybind.cpp): three read-write tensors `scale`,
  `scale_inv`, `amax_history`, undefined (None) until set, no other attribute; with it delayed scaling's update
  (common/recipe/delayed_scaling.cu) gives scale = E4M3's max 448 / amax = 448 / 2 = 224 for a history [[2]];
- `Module.cuda()` (rule R3 on a module): the module itself when every parameter and buffer is on the emulated device,
  refused naming the tensor otherwise (strict, as for a tensor);
- an NVFP4 GEMM over zero tokens (test_sanity.py's test_sanity_linear_with_zero_tokens): the copies of a (0, K)
  tensor, packed (0, K/2) rowwise and (K, 0) columnwise, read as (0, K) and (K, 0) block products, the empty GEMM
  then TE's zero output."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import block_quantize, cuda, nvfp4


@pytest.fixture(scope="module")
def tex() -> types.ModuleType:
    tecpu.boot()
    import transformer_engine_torch

    return transformer_engine_torch


def test_fp8_tensor_meta_holds_three_tensors(tex) -> None:
    meta = tex.FP8TensorMeta()
    assert (meta.scale, meta.scale_inv, meta.amax_history) == (None, None, None), "undefined until set"
    meta.scale = torch.ones(1)
    assert torch.equal(meta.scale, torch.ones(1)), f"scale not kept: {meta.scale}"
    with pytest.raises(TypeError, match="FP8TensorMeta.scale_inv takes a torch.Tensor"):
        meta.scale_inv = 1.0
    with pytest.raises(AttributeError):
        meta.amax = torch.ones(1)


def test_fp8_tensor_meta_through_delayed_scaling_update(tex) -> None:
    meta = tex.FP8TensorMeta()
    meta.scale = torch.ones(1)
    meta.amax_history = torch.tensor([[2.0]])
    tex.fused_amax_and_scale_update_after_reduction(meta.amax_history.clone().view(-1), [meta.amax_history],
                                                    [meta.scale], "max", tex.DType.kFloat8E4M3, 0)
    assert meta.scale.tolist() == [224.0], f"scale {meta.scale.tolist()}, want 448 / 2 = 224"


def test_module_cuda_is_the_module_on_the_emulated_device() -> None:
    module = torch.nn.Linear(4, 4)
    assert cuda.to_emulated_device(module) is module, "R3 on a module must return the module itself"


def test_module_cuda_off_the_emulated_device_names_the_tensor() -> None:
    module = torch.nn.Linear(4, 4, device="meta")
    with pytest.raises(tecpu.Unemulated, match=r"Module\.cuda\(\) of a Linear whose weight is on meta"):
        cuda.to_emulated_device(module)


def zero_token_products(tex) -> list[tuple[int, ...]]:
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    qx = NVFP4Quantizer(fp4_dtype=tex.DType.kFloat4E2M1, rowwise=True, columnwise=True)(torch.zeros(0, 32))
    return [tuple(nvfp4.block_products(*block_quantize._nvfp4_products(qx, columnwise)[:2]).shape)
            for columnwise in (False, True)]


def test_nvfp4_copies_of_zero_tokens_read_as_empty_matrices(tex) -> None:
    assert zero_token_products(tex) == [(0, 32), (32, 0)]


def test_planted_unpack_by_inferred_width_fails_on_zero_tokens(tex, monkeypatch) -> None:
    """The rule before: reshape(rows, -1), which no width can satisfy for zero rows."""
    monkeypatch.setattr(nvfp4, "decode_packed", lambda data: nvfp4.BYTE_WORDS.index_select(
        0, data.reshape(-1).int()).view(torch.float32).reshape(data.shape[0], -1))
    with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
        zero_token_products(tex)
