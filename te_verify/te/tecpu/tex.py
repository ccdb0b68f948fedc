"""The emulated `transformer_engine_torch` module: one TE version's surface, a PyTorch body where emulated.

Every name of the version's surface exists (TE imports many at module level); enums carry the version's
values; functions the emulation implements run in PyTorch; every other function and class raises when used,
naming itself and TE's call site (strict.py). Names outside the surface raise AttributeError, as on a GPU.
"""
from __future__ import annotations

import enum
import functools
import types
from typing import Callable

import torch

from te_verify.te.tecpu import (activation, attention, block_quantize, device, dropout, fused_router, gemm,
                                group_quantize, group_requantize, grouped_mlp_experimental, grouped_offsets,
                                grouped_tensor_gemm, kv_cache, moe_permute, multi_tensor, mxfp8_partial_cast, norm,
                                optimizers, padding, quantize, rope, router_aux_loss, scaled_activation,
                                thd_context_parallel, thd_partition)
from te_verify.te.tecpu.strict import UnemulatedFunction, unemulated_class
from te_verify.te.tecpu.surface import Surface

MODULE_NAME = "transformer_engine_torch"

# What the emulation implements: the Linear, GroupedLinear, LayerNormLinear, LayerNormMLP and te.ops Linear and
# norm paths (fp32, bf16, per-tensor FP8, MXFP8, FP8 block scaling, NVFP4).
EMULATED: dict[str, Callable] = {
    "generic_gemm": gemm.generic_gemm,
    "te_general_grouped_gemm": gemm.te_general_grouped_gemm,
    "quantize": quantize.quantize,
    "split_quantize": quantize.split_quantize,
    "dequantize": quantize.dequantize,
    "swizzle_scales_for_gemm_": block_quantize.swizzle_scales_for_gemm_,
    "bgrad_quantize": quantize.bgrad_quantize,
    "layernorm_fwd": norm.layernorm_fwd,
    "layernorm_bwd": norm.layernorm_bwd,
    "rmsnorm_fwd": norm.rmsnorm_fwd,
    "rmsnorm_bwd": norm.rmsnorm_bwd,
    "rmsnorm_bwd_add": norm.rmsnorm_bwd_add,
    # te.ops Dropout's fused path (FP16/BF16 in training).
    "dropout_fwd": dropout.dropout_fwd,
    "dropout_bwd": dropout.dropout_bwd,
    "fused_amax_and_scale_update_after_reduction": quantize.fused_amax_and_scale_update_after_reduction,
    # Fp8Padding / Fp8Unpadding around GroupedLinear (splits aligned for the quantized grouped GEMM).
    "fused_multi_row_padding": padding.fused_multi_row_padding,
    "fused_multi_row_unpadding": padding.fused_multi_row_unpadding,
    # Columnwise copies made from rowwise ones (2D block-scaled weights: update_usage / _create_columnwise).
    "fp8_transpose": block_quantize.fp8_transpose,
    "nvfp4_data_transpose": block_quantize.nvfp4_data_transpose,
    "nvfp4_2d_scale_transpose": block_quantize.nvfp4_2d_scale_transpose,
    # Library queries: fixed answers for a recent CUDA stack (TE checks minimum versions with them).
    "get_num_cublas_streams": lambda: 4,
    "get_cublasLt_version": device.cublaslt_version,  # 13.0 unless chosen at boot (device.CUBLASLT_ENV)
    "get_cudnn_version": lambda: 91400,
}
# Emulated where the version's tex has them (TE >= 2.16: QuantizedTensor.make_empty allocates through tex).
EMULATED_SINCE: dict[str, Callable] = {
    "create_empty_quantized_tensor": quantize.create_empty_quantized_tensor,
    # gelu, dgelu, dbias_dgelu, relu, ..., swiglu, dswiglu (activation.py; TE 2.8's tex has no glu).
    **activation.functions(),
    # scaled_swiglu, scaled_dswiglu, ..., scaled_dsrelu (TE >= 2.19; the SiTU ones >= 2.20).
    **scaled_activation.functions(),
    # DotProductAttention: no fused backend (cuDNN's); the unfused path's fused softmax kernels.
    **attention.functions(),
    # FusedAdam / FusedSGD: multi_tensor_adam and its capturable forms, multi_tensor_sgd.
    **optimizers.functions(),
    # Fused RoPE: apply_rotary_pos_emb(fused=True), apply_fused_qkv_rotary_pos_emb (MultiheadAttention's RoPE).
    **rope.functions(),
    # Grouped-tensor offsets from split sizes (TE >= 2.20: GroupedLinear's grouped-tensor path, te.ops' grouped MLP).
    **grouped_offsets.functions(),
    # A GroupedTensor's groups quantized into one packed storage (TE >= 2.20; GroupedLinear's grouped-tensor path).
    **group_quantize.functions(),
    # A grouped MXFP8 tensor's scales swizzled for the grouped GEMM; a prequantized one made GEMM-ready (TE >= 2.19).
    **group_requantize.functions(),
    # MoE token permutation by an index router map (te.moe_permute / moe_unpermute with map_type="index").
    **moe_permute.functions(),
    # multi_tensor_scale[_tensor], _l2norm, _unscale_l2norm, _compute_scale_and_scale_inv, _compute_scale_inv_e8m0.
    **multi_tensor.functions(),
    # The fused MoE router (te.router; TE >= 2.18): top-k with score function (and its QB form), scores for the aux
    # loss, the aux loss; forward and backward.
    **fused_router.functions(),
    **router_aux_loss.functions(),
    # Context parallelism over THD inputs (thd_*): sequence halves, LSE / output / grad corrections; CP partitions
    # and reorders.
    **thd_context_parallel.functions(),
    **thd_partition.functions(),
    # GroupedLinear's grouped-tensor GEMMs (TE >= 2.20, taken when get_cublasLt_version() >= 13.3: device.CUBLASLT_ENV).
    **grouped_tensor_gemm.functions(),
    # copy_to_kv_cache, convert_thd_to_bshd, convert_bshd_to_thd (InferenceParams' KV cache; attention with THD inputs).
    **kv_cache.functions(),
    # mxfp8_scaling_compute_partial_amax / _partial_cast (cast_master_weights_to_fp8 of MXFP8 weights, TE >= 2.14).
    **mxfp8_partial_cast.functions(),
}
# Emulated functions of the tex submodules, by submodule (the rest of a submodule's names raise when called).
EMULATED_SUBMODULES: dict[str, dict[str, Callable]] = {
    # The fused grouped MLP's discrete-weight helper (its cuDNN kernels are not emulated; TE's test calls it alone).
    "grouped_mlp_experimental": grouped_mlp_experimental.functions(),
}


class FP8TensorMeta:
    """tex.FP8TensorMeta (csrc/common.h, bound in extensions/pybind.cpp): three read-write tensors, undefined (None
    in Python) until set; pybind binds no other attribute and takes only tensors."""

    __slots__ = ("scale", "scale_inv", "amax_history")
    __module__ = MODULE_NAME

    def __init__(self) -> None:
        for name in self.__slots__:
            object.__setattr__(self, name, None)

    def __setattr__(self, name: str, value: torch.Tensor) -> None:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"FP8TensorMeta.{name} takes a torch.Tensor, not {type(value).__name__}")
        object.__setattr__(self, name, value)


# The tex classes the emulation implements (every other class of the surface raises when instantiated).
EMULATED_CLASSES: dict[str, type] = {"FP8TensorMeta": FP8TensorMeta}


def _kernel(fn: Callable) -> Callable:
    """A C++ kernel reads and writes memory outside autograd: run the emulation with grad mode off."""
    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)
    return kernel


def _enum(name: str, members: dict[str, int]) -> type[enum.IntEnum]:
    return enum.IntEnum(name, sorted(members.items(), key=lambda kv: kv[1]), module=MODULE_NAME)



def build(surface: Surface) -> types.ModuleType:
    """A fresh module object for `surface` (not yet in sys.modules)."""
    module = types.ModuleType(MODULE_NAME, f"te_verify.te.tecpu emulation of {MODULE_NAME} for TE {surface.te_version}")
    for name, members in surface.enums.items():
        setattr(module, name, _enum(name, members))
    for name in surface.classes:
        setattr(module, name, EMULATED_CLASSES.get(name) or unemulated_class(f"{MODULE_NAME}.{name}"))
    emulated = {**EMULATED_SINCE, **EMULATED}
    for name in surface.functions:
        body = emulated.get(name)
        setattr(module, name, _kernel(body) if body else UnemulatedFunction(f"{MODULE_NAME}.{name}"))
    for sub, names in surface.submodules.items():
        submodule = types.ModuleType(f"{MODULE_NAME}.{sub}")
        for name in names:
            body = EMULATED_SUBMODULES.get(sub, {}).get(name)
            setattr(submodule, name, _kernel(body) if body else UnemulatedFunction(f"{MODULE_NAME}.{sub}.{name}"))
        setattr(module, sub, submodule)
    missing = sorted((set(EMULATED) - set(surface.functions)) | (set(EMULATED_CLASSES) - set(surface.classes)))
    if missing:
        raise RuntimeError(f"TE {surface.te_version}'s tex has no {', '.join(missing)}: the emulation targets "
                           f"another tex boundary")
    module.__all__ = sorted(n for n in vars(module) if not n.startswith("_"))
    return module
