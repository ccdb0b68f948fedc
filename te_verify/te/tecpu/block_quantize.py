"""tex for the block-scaled quantizers: casts into TE's storages, dequantize, GEMM operands, the transposes.

The formats' rules live in mxfp8.py, block_fp8.py and nvfp4.py; this module places their bytes where TE's Python
reads them (block_storage.py) and follows TE 2.20.2's C++ for the rest (csrc/quantizer.cpp quantize_impl,
csrc/extensions/gemm.cpp, transpose.cpp, common/cast/dispatch/dequantize.cuh).

Stochastic rounding (NVFP4 gradients): TE's C++ takes a Philox seed and offset from the default CUDA generator
per quantization, a separate state for the columnwise copy. Here each direction draws a 63-bit seed from the
emulated device's default generator (torch.cuda's, which on the emulated device is torch's default generator, so
torch.manual_seed or torch.cuda.manual_seed make a run repeatable) and takes one random byte per element from a
torch.Generator seeded with it. The bits differ from a GPU's; the rounding rule is TE's.
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te.tecpu import block_fp8, block_scales, block_storage, device, mxfp8, nvfp4, nvfp4_4over6
from te_verify.te.tecpu.block_scales import tensor_amax
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.te_classes import te_class
from te_verify.te.tecpu.writes import write

STORAGE_KINDS = {"MXFP8TensorStorage": "MXFP8Quantizer", "Float8BlockwiseQTensorStorage": "Float8BlockQuantizer",
                 "NVFP4TensorStorage": "NVFP4Quantizer"}


def random_bytes(shape: tuple[int, ...]) -> torch.Tensor:
    """One random byte per element from a generator seeded off the emulated device's default generator."""
    seed = int(torch.randint(0, 2 ** 63 - 1, (), device=device.EMULATED))
    generator = torch.Generator(device=device.EMULATED).manual_seed(seed)
    return torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8, device=device.EMULATED)


def quantize(kind: str, q: Any, src: torch.Tensor, output: Any, noop_flag: torch.Tensor | None,
             amax: torch.Tensor | None = None) -> Any:
    """tex.quantize with a block-scaled quantizer (src contiguous); `amax`: NVFP4's per-tensor amax computed by the
    caller (NVFP4Quantizer::quantize_with_amax), else taken from src."""
    if kind == "NVFP4Quantizer":
        block_storage.check_nvfp4_options(q)
    shape = tuple(src.shape)
    if output is None:
        output = block_storage.allocate(kind, q, shape, src.dtype, src)
    else:
        shape = block_storage.coerce(kind, q, output)
    if amax is not None:  # create_unquantized_tensor_with_amax + quantize_with_amax: both directions get it first
        amax = _given_amax(q, amax)
        for name in ("_amax_rowwise", "_amax_columnwise"):
            if getattr(output, name) is not None:
                write(getattr(output, name), amax)
    if src.numel() > 0 and not (noop_flag is not None and bool(noop_flag.reshape(-1)[0] == 1)):
        x = src.reshape(block_storage.dims2(shape))
        if kind == "NVFP4Quantizer":
            _nvfp4(q, x, output, amax)
        else:
            {"MXFP8Quantizer": _mxfp8, "Float8BlockQuantizer": _block}[kind](q, x, output, shape)
    if q.optimize_for_gemm and kind in SWIZZLED_KINDS:
        swizzle_for_gemm(kind, output)
    return output


SWIZZLED_KINDS = ("MXFP8Quantizer", "NVFP4Quantizer")  # the formats whose GEMM reads swizzled scales


def swizzle_for_gemm(kind: str, t: Any) -> None:
    """cast.cpp's post-quantize step (inplace_swizzle_scale_for_gemm): a quantizer that optimizes for GEMM but whose
    kernel wrote compact scales (NVFP4 off the swizzling kernels' shapes: 1D, row-scaled, 4over6, 2D not 128-aligned)
    leaves its output with GEMM-swizzled scales all the same."""
    if t._with_gemm_swizzled_scales:
        return
    for columnwise in (False, True):
        buffer = t._columnwise_scale_inv if columnwise else t._rowwise_scale_inv
        if buffer is None or buffer.numel() == 0:
            continue
        rows, cols = _scale_dims(kind, t, columnwise)
        compact = buffer[:rows, :cols].clone()  # as the kernel wrote them: compact, padded
        block_scales.store(buffer, compact, swizzled=True, transposed=columnwise and kind == "MXFP8Quantizer")
    t._with_gemm_swizzled_scales = True


def swizzle_scales_for_gemm_(tensor: Any) -> None:
    """tex.swizzle_scales_for_gemm_ (swizzle.cpp's inplace_swizzle_scale_for_gemm; te.ops' fused grouped MLP calls
    it): an MXFP8 or NVFP4 storage's compact scales swizzled in place; any other format needs none."""
    kind = kind_of(tensor)
    if kind in SWIZZLED_KINDS:
        swizzle_for_gemm(kind, tensor)


def _scale_dims(kind: str, t: Any, columnwise: bool) -> tuple[int, int]:
    """(rows, cols) of one direction's compact scales, from its stored data."""
    data = t._columnwise_data if columnwise else t._rowwise_data
    return compact_scale_dims(kind, tuple(data.shape), columnwise)


def compact_scale_dims(kind: str, data_shape: tuple[int, ...], columnwise: bool) -> tuple[int, int]:
    """(rows, cols) of the scales of one direction's stored data of `data_shape`, unpadded (NVFP4 packs two values a
    byte)."""
    m, k = block_storage.dims2(data_shape)
    if kind == "NVFP4Quantizer":
        return m, k * 2 // nvfp4.BLOCK
    return (m // mxfp8.BLOCK, k) if columnwise else (m, k // mxfp8.BLOCK)


def _mxfp8(q: Any, x: torch.Tensor, out: Any, shape: tuple[int, ...]) -> None:
    dtype, swizzled = device.torch_dtype(q.dtype), out._with_gemm_swizzled_scales
    for usage, columnwise, data, scales in ((q.rowwise_usage, False, "_rowwise_data", "_rowwise_scale_inv"),
                                            (q.columnwise_usage, True, "_columnwise_data", "_columnwise_scale_inv")):
        if usage:
            values, e = mxfp8.quantize(x, dtype, columnwise, q.with_2d_quantization)
            write(getattr(out, data), values.reshape(shape))
            block_scales.store(getattr(out, scales), e, swizzled, transposed=columnwise)


def _block(q: Any, x: torch.Tensor, out: Any, shape: tuple[int, ...]) -> None:
    """GEMM-ready layouts: 1D scale_inv stored transposed ([k_block, m]); 2D as [m_tile, k_tile], its columnwise
    twin transposed; columnwise data transposed."""
    dtype, two_d = device.torch_dtype(q.dtype), q.block_scaling_dim == 2
    args = (dtype, two_d, q.force_pow_2_scales, q.amax_epsilon)
    rows = block_fp8.quantize(x, *args)
    if q.rowwise_usage:
        write(out._rowwise_data, rows[0].reshape(shape))
        block_scales.store(out._rowwise_scale_inv, rows[1] if two_d else rows[1].t(), swizzled=False)
    if q.columnwise_usage:
        data, scale_inv = (rows[0].t(), rows[1]) if two_d else block_fp8.quantize(x.t(), *args)
        write(out._columnwise_data, data.reshape(out._columnwise_data.shape))
        block_scales.store(out._columnwise_scale_inv, scale_inv.t(), swizzled=False)


def _nvfp4(q: Any, x: torch.Tensor, out: Any, given_amax: torch.Tensor | None) -> None:
    """Rowwise: amax(x) (or the given one); columnwise: x^T, after the RHT when the quantizer has it (its amax then
    post-RHT). Row-scaled: one amax per row of x (rowwise) and per column (columnwise); 4over6: its own kernel."""
    if q.with_rht and x.dtype != torch.bfloat16:
        raise RuntimeError(f"RHT is only supported for bfloat16 input, got {x.dtype}")
    if q.with_rht and not q.with_post_rht_amax:
        raise RuntimeError("Pre-RHT amax is not supported yet. Use with_post_rht_amax=true instead.")
    block_storage.check_nvfp4_kernel(q, x)
    if given_amax is not None:
        amax = given_amax
    else:
        amax = _row_amax(x) if q.row_scaled_nvfp4 else tensor_amax(x).reshape(1)
    swizzled = out._with_gemm_swizzled_scales
    if q.rowwise_usage:
        bits = random_bytes(tuple(x.shape)) if q.stochastic_rounding else None
        data, scales = _nvfp4_encode(q, x, amax, bits)
        write(out._amax_rowwise, amax)
        write(out._rowwise_data, data.reshape(out._rowwise_data.shape))
        block_scales.store(out._rowwise_scale_inv, scales, swizzled)
    if q.columnwise_usage:
        x_t = nvfp4.hadamard(x.t().contiguous(), q.rht_matrix) if q.with_rht else x.t()
        amax_t = tensor_amax(x_t).reshape(1) if q.with_rht else (_row_amax(x_t) if q.row_scaled_nvfp4 else amax)
        bits = random_bytes(tuple(x_t.shape)) if q.stochastic_rounding else None
        data, scales = _nvfp4_encode(q, x_t, amax_t, bits)
        write(out._amax_columnwise, amax_t)
        write(out._columnwise_data, data)
        block_scales.store(out._columnwise_scale_inv, scales, swizzled)


def _given_amax(q: Any, amax: torch.Tensor) -> torch.Tensor:
    """quantize_with_amax's amax, one for both directions (TE's activations never hand it an RHT quantizer)."""
    if q.row_scaled_nvfp4:
        raise RuntimeError("quantize_with_amax is not supported for row-scaled NVFP4 quantization.")
    if q.with_rht:
        refuse("NVFP4 quantize_with_amax with the RHT")
    return amax.float().reshape(1)


def _row_amax(x: torch.Tensor) -> torch.Tensor:
    """Row-scaled NVFP4's amax, one per row (compute_rowwise_amax_kernel: max |x| per row, NaN skipped)."""
    return block_scales.block_amax(x.float(), 1, x.shape[1]).reshape(-1)


def _nvfp4_encode(q: Any, x: torch.Tensor, amax: torch.Tensor,
                  bits: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize.cuh's NVFP4 dispatch: the 4over6 kernel when the quantizer has it, else the plain cast."""
    if q.nvfp4_use_4over6:
        return nvfp4_4over6.quantize(x, amax, q.nvfp4_e4m3_max, q.nvfp4_4over6_err_mode,
                                     nvfp4_4over6.err_use_fast_math(), q.with_2d_quantization)
    return nvfp4.quantize(x, amax, q.with_2d_quantization, bits)


def kind_of(t: Any) -> str | None:
    """The quantizer kind of a block-scaled storage, None for anything else."""
    return next((k for name, k in STORAGE_KINDS.items() if isinstance(t, te_class(name))), None)


def _fp8_values(t: Any, columnwise: bool) -> torch.Tensor:
    """An MXFP8 storage's fp32 values (logical shape, 2-D) from one direction's data and scales."""
    data = t._columnwise_data if columnwise else t._rowwise_data
    m, k = block_storage.dims2(tuple(data.shape))
    rows, cols = (m // mxfp8.BLOCK, k) if columnwise else (m, k // mxfp8.BLOCK)
    buffer = t._columnwise_scale_inv if columnwise else t._rowwise_scale_inv
    scales = block_scales.load(buffer, rows, cols, t._with_gemm_swizzled_scales, transposed=columnwise)
    return mxfp8.dequantize(data.reshape(m, k), scales, device.torch_dtype(t._fp8_dtype), columnwise)


def _nvfp4_products(t: Any, columnwise: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed data, compact scales, amax) of one direction of an NVFP4 storage, in its stored orientation."""
    data = t._columnwise_data if columnwise else t._rowwise_data
    data = data.reshape(block_storage.dims2(tuple(data.shape)))  # dims named: a copy of zero tokens has 0 columns
    buffer = t._columnwise_scale_inv if columnwise else t._rowwise_scale_inv
    scales = block_scales.load(buffer, *_scale_dims("NVFP4Quantizer", t, columnwise), t._with_gemm_swizzled_scales)
    return data, scales, (t._amax_columnwise if columnwise else t._amax_rowwise)


def dequantize(t: Any, otype: torch.dtype) -> torch.Tensor:
    """tex.dequantize of an MXFP8 (sm100+, rowwise data if present) or NVFP4 (rowwise) storage."""
    kind = kind_of(t)
    if kind == "Float8BlockQuantizer":  # TE's Python dequantizes these itself; the C++ dispatch has no case
        raise RuntimeError(f"Not implemented scaling mode: NVTE_BLOCK_SCALING_{'2D' if t._is_2D_scaled else '1D'}.")
    shape = block_storage.logical_shape(kind, t)
    if kind == "MXFP8Quantizer":
        if device.sm_arch() < 100:
            raise RuntimeError("MXFP8 Dequantization is NOT supported by architectures < 10.0")
        return _fp8_values(t, columnwise=t._rowwise_data is None).reshape(shape).to(otype)
    if t._rowwise_data is None:
        raise RuntimeError("Cannot dequantize NVFP4 tensor without rowwise data.")
    data, scales, amax = _nvfp4_products(t, columnwise=False)
    if t._row_scaled_nvfp4 and amax.numel() != data.shape[0]:
        raise RuntimeError("Row-scaled NVFP4 dequantization requires one rowwise amax per row.")
    return nvfp4.dequantize(data, scales, amax, t._nvfp4_e4m3_max).reshape(shape).to(otype)


def gemm_operand(t: Any, name: str, use_rowwise: bool) -> tuple[torch.Tensor, torch.Tensor | nvfp4.GlobalScale, str]:
    """(the operand's logical 2-D matrix with its block scales applied, fp32; its per-tensor factor, for NVFP4 its
    GlobalScale (gemm.product builds cuBLAS's alpha from both); its kind) from
    the copy the GEMM reads: rowwise for A transposed / B not transposed, else columnwise (gemm.cpp
    swizzle_scales_for_gemm(A, transa, !transa), (B, !transb, transb))."""
    kind = kind_of(t)
    if kind == "NVFP4Quantizer" and t._row_scaled_nvfp4:  # cublaslt_gemm.cu's first check; TE's Python passes
        raise RuntimeError("cuBLAS GEMM does not support row-scaled NVFP4 inputs.")  # aliases with amax 1 instead
    _check_capability(kind)
    check_usage(t, name, use_rowwise)
    one = torch.ones((), dtype=torch.float32, device=device.EMULATED)
    if kind == "MXFP8Quantizer":
        return _fp8_values(t, columnwise=not use_rowwise), one, kind
    if kind == "NVFP4Quantizer":
        data, scales, amax = _nvfp4_products(t, columnwise=not use_rowwise)
        products = nvfp4.block_products(data, scales)
        scale = nvfp4.GlobalScale(amax.float().reshape(()), t._nvfp4_e4m3_max)
        return (products if use_rowwise else products.t()), scale, kind
    return block_values(t, use_rowwise), one, kind


def check_usage(t: Any, name: str, use_rowwise: bool) -> None:
    """The copy a GEMM reads exists, else TE's error."""
    if (t._rowwise_data if use_rowwise else t._columnwise_data) is None:
        raise RuntimeError(f"Input {name} is missing {'row' if use_rowwise else 'column'}-wise usage")


def block_fp8_copy(t: Any, use_rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """An FP8 block-scaled storage's copy in one direction as stored (2-D, its 128-wide blocks along the last dim: the
    columnwise copy is the transpose) and its compact scale_inv (per 128 x 128 block, or per row and 128 columns)."""
    data = t._rowwise_data if use_rowwise else t._columnwise_data
    data = data.reshape(-1, data.shape[-1]) if use_rowwise else data.reshape(data.shape[0], -1)
    buffer = t._rowwise_scale_inv if use_rowwise else t._columnwise_scale_inv
    m, k = data.shape
    blocks = -(-k // block_fp8.BLOCK)
    return data, buffer[:-(-m // block_fp8.BLOCK), :blocks] if t._is_2D_scaled else buffer[:blocks, :m].t()


def block_values(t: Any, use_rowwise: bool, gemm: bool = True) -> torch.Tensor:
    """An FP8 block-scaled storage's fp32 values (logical shape, 2-D) from one direction; as a GEMM operand on sm100
    its scales must be powers of 2 (TE converts them to MXFP8's), which a dequantize does not ask."""
    data, scale_inv = block_fp8_copy(t, use_rowwise)
    if gemm and device.sm_arch() >= 100 and not _powers_of_two(scale_inv):
        refuse("an FP8 block-scaling GEMM with non-power-of-2 scales on sm100 (TE converts it to MXFP8)")
    values = block_fp8.dequantize(data, scale_inv, device.torch_dtype(t._fp8_dtype), t._is_2D_scaled)
    return values if use_rowwise else values.t()


def _powers_of_two(x: torch.Tensor) -> bool:
    """Every value 0 or +-2^k (fp32 subnormals included)."""
    return bool(((torch.frexp(x).mantissa.abs() == 0.5) | (x == 0)).all())


def _check_capability(kind: str) -> None:
    arch, name = device.sm_arch(), device.capability_name()
    if kind in ("MXFP8Quantizer", "NVFP4Quantizer") and arch < 100:
        refuse(f"a {kind.removesuffix('Quantizer')} GEMM on emulated {name} (cuBLASLt's block-scaled GEMMs need sm100)")
    if kind == "Float8BlockQuantizer" and arch < 90:
        refuse(f"an FP8 block-scaling GEMM on emulated {name} (TE needs sm90)")


def fp8_transpose(input: torch.Tensor, dtype: Any, out: torch.Tensor | None = None) -> torch.Tensor:  # noqa: A002
    """tex.fp8_transpose: the bytes of a (..., N) tensor as (N, ...) (last dim first), into `out` if given."""
    m, n = block_storage.dims2(tuple(input.shape))
    result = input.reshape(m, n).t().reshape(n, *input.shape[:-1])
    if out is None:
        return result.contiguous()
    write(out, result.reshape(out.shape))
    return out


def nvfp4_data_transpose(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:  # noqa: A002
    """tex.nvfp4_data_transpose: packed (M, K/2) as packed (K, M/2), nibbles repacked."""
    if input.dim() != 2:
        raise RuntimeError("NVFP4 transpose expects 2D input (packed storage).")
    if input.shape[0] % 2:
        raise RuntimeError(f"NVFP4 transpose requires M ({input.shape[0]}) to be even.")
    result = nvfp4.pack(nvfp4.unpack(input).t().contiguous())
    if out is None:
        return result
    if tuple(out.shape) != tuple(result.shape):
        raise RuntimeError("Output shape mismatch for NVFP4 transpose.")
    return write(out, result)


def nvfp4_2d_scale_transpose(input: torch.Tensor, output: torch.Tensor,  # noqa: A002 -- pybind's argument names
                             M_tiles: int, K_tiles: int) -> None:  # noqa: N803
    """tex.nvfp4_2d_scale_transpose: rowwise [M_padded, K_tiles] scales of 16x16 tiles (each tile's scale on its 16
    rows) as columnwise [K_padded, M_tiles] (each on its 16 columns' rows)."""
    if input.dim() != 2 or output.dim() != 2:
        raise RuntimeError("NVFP4 scale transpose expects 2D input.")
    if input.dtype != torch.uint8 or output.dtype != torch.uint8:
        raise RuntimeError("NVFP4 scale transpose input must be uint8 (E4M3).")
    tiles = input[0:M_tiles * nvfp4.BLOCK:nvfp4.BLOCK, :K_tiles]  # (M_tiles, K_tiles)
    write(output[:K_tiles * nvfp4.BLOCK, :M_tiles], tiles.t().repeat_interleave(nvfp4.BLOCK, 0))
