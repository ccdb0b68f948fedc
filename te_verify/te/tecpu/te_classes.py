"""TE's own Python classes the tex functions construct or recognise, looked up after TE is imported."""
from __future__ import annotations

import functools
import importlib

_MODULES = {
    "Float8Quantizer": "transformer_engine.pytorch.tensor.float8_tensor",
    "Float8CurrentScalingQuantizer": "transformer_engine.pytorch.tensor.float8_tensor",
    "Float8Tensor": "transformer_engine.pytorch.tensor.float8_tensor",
    "Float8TensorStorage": "transformer_engine.pytorch.tensor.storage.float8_tensor_storage",
    "QuantizedTensorStorage": "transformer_engine.pytorch.quantized_tensor",
    "MXFP8Quantizer": "transformer_engine.pytorch.tensor.mxfp8_tensor",
    "MXFP8Tensor": "transformer_engine.pytorch.tensor.mxfp8_tensor",
    "MXFP8TensorStorage": "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage",
    "Float8BlockQuantizer": "transformer_engine.pytorch.tensor.float8_blockwise_tensor",
    "Float8BlockwiseQTensor": "transformer_engine.pytorch.tensor.float8_blockwise_tensor",
    "Float8BlockwiseQTensorStorage": "transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage",
    "NVFP4Quantizer": "transformer_engine.pytorch.tensor.nvfp4_tensor",
    "NVFP4Tensor": "transformer_engine.pytorch.tensor.nvfp4_tensor",
    "NVFP4TensorStorage": "transformer_engine.pytorch.tensor.storage.nvfp4_tensor_storage",
    "GroupedTensorStorage": "transformer_engine.pytorch.tensor.storage.grouped_tensor_storage",
}


@functools.cache
def te_class(name: str) -> type:
    return getattr(importlib.import_module(_MODULES[name]), name)


def shape_of(t: object) -> tuple[int, ...]:
    """A tensor's or a TE storage's shape (TE's storages have `.shape` from 2.20 on, `size()` before)."""
    shape = getattr(t, "shape", None)
    return tuple(shape) if shape is not None else tuple(t.size())
