"""What TE's own tests (test_recipe.py, run over the emulation by scripts/te_own_tests.py) showed missing, each from
its definition:
- `tex.FP8TensorMeta` (csrc/common.h, bound in extensions/pybind.cpp): three read-write tensors `scale`,
  `scale_inv`, `amax_history`, undefined (None) until set, no other attribute; with it delayed scaling's update
  (common/recipe/delayed_scaling.cu) gives scale = E4M3's max 448 / amax = 448 / 2 = 224 for a history [[2]];
- `Module.cuda()` (rule R3 on a module): the module itself when every parameter and buffer is on the emulated device,
  refused naming the tensor otherwise (strict, as for a tensor)."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import cuda


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
