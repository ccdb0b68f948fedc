"""tex's grouped-tensor GEMMs (TE >= 2.20: GroupedLinear's graph-safe path, cuBLASLt >= 13.3): one GEMM per group of
GroupedTensor operands, from csrc/extensions/gemm.cpp (2.20.2 sdist) and common/gemm/cublaslt_grouped_gemm.cu (main
d0067d0).

te_general_grouped_gemm_for_grouped_tensor (A, B, D all GroupedTensors), _for_discrete_in (A a list of per-group
tensors: te.ops' weights) and _for_discrete_out (D a list: the wgrads) compute, for each group i, D_i = alpha_i *
op(B_i) @ op(A_i) + beta_i * D_i (C is D), in TE's row-major reading (gemm.py), then, for a GroupedTensor D, the bias
epilogue kernels (nvte_grouped_bias_add: d = T(float(d) + float(b)); nvte_grouped_scaled_bias_add: d = T(fmaf(b, s[row],
d)), fmaf rounded once (reduction_order.fma), over the rows sum(first_dims) of D's packed rowwise buffer). Each group's
product is gemm.py's (gemm._product: its operand copies, dequantization and fp32 accumulation, FP8 block scaling's
blockwise accumulation on sm90), so the grouped GEMM is exactly the emulated single GEMM of the group; alpha multiplies the product, beta the old D in fp32, as generic_gemm's. Groups are read
through TE's own GroupedTensorStorage.split_into_quantized_tensors (its metadata caches restored), their scales read
as swizzled when the grouped tensor says so (MXFP8 unswizzled scales are swizzled by the binding into a temporary: the
same values). The kernel's checks are kept: SM 9.0 to 11.0; cuBLASLt >= 13.3, on Hopper >= 13.4; per-group alpha and
beta (num_tensors elements) on SM >= 10.0, else one; BF16/FP16/FP8/NVFP4 inputs, BF16/FP16/FP32 outputs; compatible
scaling modes (FP8 block scaling on Hopper only, not 2D by 2D, cuBLASLt >= 13.4; NVFP4 on Blackwell, >= 13.4, swizzled
scales; FP8 tensor scaling on Hopper >= 13.5); at most 64 discrete tensors; the setup workspace's size.
get_grouped_gemm_setup_workspace_size is the kernel's layout walk. The swizzle and requantize steps before these GEMMs
are group_requantize.py's, grouped_mlp_experimental's scale packing grouped_mlp_experimental.py's. Not emulated (refused
as unemulated by the tex surface): group_scaled_swiglu / group_scaled_clamped_swiglu.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from te_verify.te.tecpu import device, gemm, gemm_admission
from te_verify.te.tecpu.group_quantize import group_views
from te_verify.te.tecpu.reduction_order import fma
from te_verify.te.tecpu.te_classes import shape_of, te_class
from te_verify.te.tecpu.writes import write

GROUPED_GEMM_VERSION, HOPPER_VERSION, FP8_TENSOR_HOPPER_VERSION = 130300, 130400, 130500
MAX_GROUPS = 64  # kMaxGroups: discrete lists and the bias kernel
CUBLAS_WORKSPACE_BYTES = 32 * 1024 * 1024
_INPUT_DTYPES = (torch.bfloat16, torch.float16)
_OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def get_grouped_gemm_setup_workspace_size(num_tensors: int) -> int:
    """GroupedGemmSetupWorkspace::required_setup_size: 8 pointer arrays (each 16-byte aligned), 6 int arrays, 1 float
    array, plus 256 bytes of alignment slack."""
    offset = 0
    for _ in range(8):
        offset = -(-offset // 16) * 16 + 8 * num_tensors
    return offset + 7 * 4 * num_tensors + 256


def _requirements(api: str) -> tuple[int, int]:
    """check_grouped_gemm_requirements (a library built with cuBLAS >= 13.4, Hopper's kernels included)."""
    sm, version = device.sm_arch(), device.cublaslt_version()
    if not 90 <= sm <= 110:
        raise RuntimeError(f"{api} requires Hopper (SM90) or Blackwell (SM10x and SM110).")
    if version < GROUPED_GEMM_VERSION:
        raise RuntimeError(f"{api} requires cuBLAS 13.3+, but run-time cuBLAS version is {version}")
    if sm < 100 and version < HOPPER_VERSION:
        raise RuntimeError(f"{api} on Hopper (SM90) requires cuBLAS 13.4+, but run-time cuBLAS version is {version}")
    return sm, version


def _check_inputs(api: str, a_groups: list, b_groups: list, sm: int, version: int,
                  b_grouped: Any, a_grouped: Any) -> None:
    """validate_grouped_gemm_inputs and the scaling-mode checks, on the groups' formats."""
    modes = {gemm_admission.scaling_mode(t) for t in a_groups + b_groups}
    quantized = [isinstance(t, te_class("QuantizedTensorStorage")) for t in a_groups + b_groups]
    if any(quantized) != all(quantized):
        raise RuntimeError("Grouped GEMM: A and B must both be FP8 or both be non-FP8.")
    for t in a_groups + b_groups:
        if not quantized[0] and t.dtype not in _INPUT_DTYPES:
            raise RuntimeError(f"Grouped GEMM inputs must be FP8, NVFP4, BF16, or FP16, got {t.dtype}.")
    a_mode, b_mode = gemm_admission.scaling_mode(a_groups[0]), gemm_admission.scaling_mode(b_groups[0])
    block = {"NVTE_BLOCK_SCALING_1D", "NVTE_BLOCK_SCALING_2D"}
    if a_mode == b_mode == "NVTE_BLOCK_SCALING_2D":
        raise RuntimeError(f"{api}: Only 1D by 1D, 1D by 2D, and 2D by 1D FP8 block scaling grouped GEMM is "
                           "supported, but got 2D by 2D.")
    if not (modes <= block or len(modes) == 1):
        raise RuntimeError(f"{api}: incompatible A/B scaling modes.")
    if modes <= block:
        if not 90 <= sm < 100:
            raise RuntimeError(f"{api}: FP8 block scaling grouped GEMM is only supported on Hopper (SM90-SM99), "
                               f"not SM{sm}.")
        if version < HOPPER_VERSION:
            raise RuntimeError(f"FP8 block scaling grouped GEMM requires cuBLAS 13.4+, but run-time cuBLAS version "
                               f"is {version}")
    if "NVTE_NVFP4_1D_SCALING" in modes:
        if sm < 100:
            raise RuntimeError("Grouped GEMM: NVFP4 requires per-group alpha/beta support because each group has "
                               "its own amax-derived global scale.")
        if version < HOPPER_VERSION:
            raise RuntimeError(f"NVFP4 grouped GEMM requires cuBLAS 13.4+, but run-time cuBLAS version is {version}")
        for g in (a_grouped, b_grouped):
            if g is not None and not g._with_gemm_swizzled_scales:
                raise RuntimeError("Grouped GEMM: scales must be swizzled for GEMM (MXFP8/NVFP4).")
    if any(gemm_admission.is_fp8(t) for t in a_groups + b_groups) and sm < 100:
        if version < FP8_TENSOR_HOPPER_VERSION:
            raise RuntimeError(f"FP8 tensor scaling grouped GEMM on Hopper (SM90) requires cuBLAS 13.5+, but run-time "
                               f"cuBLAS version is {version}")


def _scalars(alpha: torch.Tensor, beta: torch.Tensor, num: int, sm: int) -> tuple[list[float], list[float]]:
    expected = num if sm >= 100 else 1
    for name, t in (("alpha", alpha), ("beta", beta)):
        if t.numel() != expected:
            raise RuntimeError(f"Grouped GEMM: {name} must have {'num_tensors' if sm >= 100 else '1'} element(s), "
                               f"got {t.numel()}")
    a, b = alpha.float().reshape(-1).tolist(), beta.float().reshape(-1).tolist()
    return (a, b) if sm >= 100 else (a * num, b * num)


def _run(api: str, A: Any, a_groups: list, transa: bool, B: Any, transb: bool, d_groups: list,
         alpha: torch.Tensor, beta: torch.Tensor, workspace_setup: torch.Tensor,
         workspace_cublas: torch.Tensor) -> None:
    """nvte_grouped_gemm*: the checks, then each group's GEMM into its output."""
    sm, version = _requirements(api)
    num = len(d_groups)
    b_groups = group_views(B)
    alphas, betas = _scalars(alpha, beta, num, sm)
    _check_inputs(api, a_groups, b_groups, sm, version, B, A)
    for d in d_groups:
        if d.dtype not in _OUTPUT_DTYPES:
            raise RuntimeError("Grouped GEMM: outputs must be BF16, FP16, or FP32.")
        if d.dtype == torch.float16 and gemm_admission.scaling_mode(b_groups[0]) == "NVTE_NVFP4_1D_SCALING":
            raise RuntimeError("FP4 GEMM does not support FP16 output!")
    setup_size = get_grouped_gemm_setup_workspace_size(num)
    for name, ws, size in (("Grouped GEMM setup workspace", workspace_setup, setup_size),
                           ("Grouped GEMM cuBLAS workspace", workspace_cublas, CUBLAS_WORKSPACE_BYTES)):
        provided = ws.numel() * ws.element_size()
        if provided < size:
            raise RuntimeError(f"Grouped GEMM: Insufficient {name}. Required: {size} bytes, Available: {provided} "
                               "bytes.")
    for i, (a, b, d) in enumerate(zip(a_groups, b_groups, d_groups)):
        shape = gemm.output_shape(shape_of(a), transa, shape_of(b), transb)
        if list(d.shape) != shape:
            raise RuntimeError(f"Grouped GEMM: group {i} output has shape {list(d.shape)}, expected {shape}")
        if d.numel() == 0:
            continue
        if math.prod(shape_of(a)) == 0 or math.prod(shape_of(b)) == 0:  # k = 0: alpha * 0 + beta * C
            result = torch.zeros(shape, dtype=torch.float32, device=device.EMULATED)
        else:
            result = gemm._product(a, transa, b, transb) * alphas[i]
        accumulate = betas[i] != 0.0
        gemm._write(gemm._before_c(result, a, b, d.dtype, accumulate), d, shape, d.dtype, accumulate, betas[i])


def _bias_add(D: Any, bias: Any, bias_scale: torch.Tensor | None) -> None:
    """nvte_grouped_(scaled_)bias_add over D's packed rows: group i's rows get bias row i (times scale[row])."""
    api = "Grouped scaled bias add" if bias_scale is not None else "Grouped bias add"
    num = D.num_tensors
    if bias.num_tensors != num:
        raise RuntimeError(f"{api}: output and bias must have the same number of tensors")
    d_dtype = D.rowwise_data.dtype if D.rowwise_data is not None else None
    if bias.rowwise_data is None or bias.rowwise_data.dtype != d_dtype:
        raise RuntimeError(f"{api}: output and bias must have matching dtypes")
    if bias.first_dims is not None or bias.logical_shape[0] != num:
        raise RuntimeError(f"{api}: bias first dim must be 1")
    if D.last_dims is not None or bias.last_dims is not None:
        raise RuntimeError(f"{api}: requires uniform last dim for output and bias")
    n = D.logical_shape[1]
    if bias.logical_shape[1] != n:
        raise RuntimeError(f"{api}: output and bias last dims must match")
    if num > MAX_GROUPS:
        raise RuntimeError(f"{api} supports at most {MAX_GROUPS} tensors, got {num}")
    total = D.logical_shape[0]
    if bias_scale is not None:
        if bias_scale.dtype != torch.float32:
            raise RuntimeError("Grouped scaled bias add: scale must be float32")
        if bias_scale.dim() != 1 or bias_scale.shape[0] != total:
            raise RuntimeError(f"Grouped scaled bias add: scale size ({bias_scale.shape[0]}) must equal total rows "
                               f"({total})")
    if total == 0:
        return
    vec = 8 if D.rowwise_data.element_size() <= 2 else 4
    if n % vec:
        raise RuntimeError(f"{api}: requires last dim divisible by {vec}")
    firsts = D.first_dims.tolist() if D.first_dims is not None else [total // num] * num
    rows = torch.repeat_interleave(torch.arange(num), torch.tensor(firsts, dtype=torch.int64))
    d = D.rowwise_data.reshape(-1)[:rows.numel() * n].view(-1, n)
    b = bias.rowwise_data.reshape(num, n)[rows].float()
    if bias_scale is None:
        write(d, (d.float() + b).to(d.dtype))
    else:
        write(d, fma(b, bias_scale[:rows.numel()].reshape(-1, 1).expand_as(b), d.float()).to(d.dtype))


def _epilogue(D: Any, bias: Any, bias_scale: torch.Tensor | None) -> None:
    if bias is not None:
        _bias_add(D, bias, bias_scale)


SAME_AB = "Grouped GEMM requires A and B to have the same num_tensors."
SAME_D = "Grouped GEMM requires D to have the same num_tensors as inputs."


def _check_counts(num: int, counts: list[tuple[int, str]], discrete: str | None = None) -> None:
    """The bindings' group-count checks, with their messages: num > 0, each other count equal to it, and at most
    MAX_GROUPS in a discrete list (`discrete` names it)."""
    if num <= 0:
        raise RuntimeError("Grouped GEMM requires non-empty inputs.")
    for count, message in counts:
        if count != num:
            raise RuntimeError(message)
    if discrete is not None and num > MAX_GROUPS:
        raise RuntimeError(f"Grouped GEMM: {discrete} size ({num}) exceeds the maximum of {MAX_GROUPS} groups")


def te_general_grouped_gemm_for_grouped_tensor(A: Any, transa: bool, B: Any, transb: bool, D: Any, bias: Any,
                                               bias_scale: torch.Tensor | None, alpha: torch.Tensor,
                                               beta: torch.Tensor, workspace_setup: torch.Tensor,
                                               workspace_cublas: torch.Tensor, use_split_accumulator: bool,
                                               math_sm_count: int) -> Any:
    _check_counts(A.num_tensors, [(B.num_tensors, SAME_AB), (D.num_tensors, SAME_D)])
    _run("nvte_grouped_gemm", A, group_views(A), transa, B, transb, group_views(D), alpha, beta, workspace_setup,
         workspace_cublas)
    _epilogue(D, bias, bias_scale)
    return D


def te_general_grouped_gemm_for_discrete_in(A: list, transa: bool, B: Any, transb: bool, D: Any, bias: Any,
                                            bias_scale: torch.Tensor | None, alpha: torch.Tensor,
                                            beta: torch.Tensor, workspace_setup: torch.Tensor,
                                            workspace_cublas: torch.Tensor, use_split_accumulator: bool,
                                            math_sm_count: int) -> Any:
    _check_counts(B.num_tensors, [(len(A), "Grouped GEMM requires A_list to have num_tensors elements."),
                                  (D.num_tensors, SAME_D)], discrete="A_list")
    _run("nvte_grouped_gemm_with_discrete_inputA", None, list(A), transa, B, transb, group_views(D), alpha, beta,
         workspace_setup, workspace_cublas)
    _epilogue(D, bias, bias_scale)
    return D


def te_general_grouped_gemm_for_discrete_out(A: Any, transa: bool, B: Any, transb: bool, D: list, bias: Any,
                                             bias_scale: torch.Tensor | None, alpha: torch.Tensor,
                                             beta: torch.Tensor, workspace_setup: torch.Tensor,
                                             workspace_cublas: torch.Tensor, use_split_accumulator: bool,
                                             math_sm_count: int) -> Any:
    if bias is not None:
        raise RuntimeError("Bias is not supported for discrete output grouped GEMM.")
    _check_counts(A.num_tensors, [(B.num_tensors, SAME_AB),
                                  (len(D), "Grouped GEMM requires D_list to have num_tensors elements.")],
                  discrete="D_list")
    _run("nvte_grouped_gemm_with_discrete_out", A, group_views(A), transa, B, transb, list(D), alpha, beta,
         workspace_setup, workspace_cublas)
    return D


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    return {"get_grouped_gemm_setup_workspace_size": get_grouped_gemm_setup_workspace_size,
            "te_general_grouped_gemm_for_grouped_tensor": te_general_grouped_gemm_for_grouped_tensor,
            "te_general_grouped_gemm_for_discrete_in": te_general_grouped_gemm_for_discrete_in,
            "te_general_grouped_gemm_for_discrete_out": te_general_grouped_gemm_for_discrete_out}
