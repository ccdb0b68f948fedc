"""What TE's fused MoE router kernels share (common/fused_router/utils.h, as in TE 2.18 to 2.20): the score functions,
the warp's softmax, top-k selection and routing-map layouts, computed per token in fp32 as the kernels do.

- Score functions: sigmoid 1 / (1 + expf(-x)); sqrtsoftplus sqrtf(x > 20 ? x : log1pf(expf(x))); their backward
  y (1 - y) and (x > 20 ? 1 : sigmoid(x)) / (2 y + 1e-20). expf and log1pf are evaluated in fp64 and rounded once
  (correctly rounded); CUDA's are within 2 and 1 ulp of exact: an output may differ from the GPU's by an fp32 ulp.
- Softmax (apply_softmax_on_float): each of 32 lanes runs an online max and sum over its strided elements, the lanes
  merge (max, sum) pairs by xor-butterfly (a lane with no data counts 0), then expf(x - max) * (1 / sum). The merge's
  two products are rounded apart here (nvcc may fuse one into an FMA: an ulp of the sum).
- Top-k (topk_and_mask) returns the selected experts in the kernel's order. Below NVTE_RADIX_TOPK_THRESHOLD (16;
  read once per kernel file, as TE's static does) the naive selection takes k maxima in turn: a lane keeps the first
  of its strided elements on equal values, and the warp's butterfly keeps lane 0's side, so equal values go to the
  lane with the smaller bit-reversed id, then the earlier element; -0 equals +0. At or above it the radix selection
  takes the k-th largest fp32 bit pattern (order-preserving uint: -0 below +0), the larger ones in index order, then
  equal ones in index order up to k. NaN scores are refused (their order depends on NaN bit patterns the GPU's and
  the CPU's arithmetic make differently), and so is a naive selection reaching -inf (the kernel's lanes then fall
  back to their own index, possibly an expert twice). More than 4,096 experts are refused (shared memory: the kernels
  check the device's 227 KB per block; not emulated).
- Routing maps: BYTEMAP bool [.., E]; BITMAP_U8 uint8 [.., ceil(E / 8)], bit e % 8 of byte e // 8 (LSB first).
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

import torch
from packaging.version import Version

from te_verify.te.tecpu import reduction_order
from te_verify.te.tecpu.device import EMULATED
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.surface import installed_te_version

SIGMOID, SOFTMAX, SQRTSOFTPLUS = 0, 1, 2  # score_function_map in csrc/extensions/router.cpp
SCORE_FUNCTIONS = {"sigmoid": SIGMOID, "softmax": SOFTMAX, "sqrtsoftplus": SQRTSOFTPLUS}
BYTEMAP, BITMAP_U8 = 0, 1  # NVTERoutingMapFormat
PROBS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # TE_ROUTER_PROBS_TYPE_SWITCH_ALL
INDEX_DTYPES = (torch.int16, torch.int32, torch.int64)  # TE_ROUTER_DENSE_INDEX_TYPE_SWITCH_ALL
EPSILON = torch.tensor(1e-20, dtype=torch.float32, device=EMULATED)  # utils.h's epsilon, an fp32 constant
INT_MAX = 2**31 - 1
MAX_EXPERTS = 4096
# The binding's arguments and the kernels verified here are TE 2.18's to 2.20's (router.cpp identical but for the QB
# function of 2.20; the kernels identical but for QB). TE 2.17's binding takes no topk_indices / use_dense_indices;
# 2.14 to 2.16 pass num_tokens and num_experts and predate the bitmap and radix kernels: not verified, refused.
SINCE = Version("2.18")


def since_verified(*functions: Callable) -> dict[str, Callable]:
    """The functions by name, each refusing before it binds its arguments under a TE version before SINCE."""
    def guarded(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            version = installed_te_version()
            if version < SINCE:
                refuse(f"tex.{fn.__name__} under TE {version} (its binding and kernels before {SINCE} are not the "
                       "ones emulated)")
            return fn(*args, **kwargs)
        return call
    return {fn.__name__: guarded(fn) for fn in functions}


def check_experts(num_experts: int, num_tokens: int, name: str) -> None:
    if num_experts > MAX_EXPERTS:
        refuse(f"tex.{name} over {num_experts} experts (> {MAX_EXPERTS}: the kernels' shared memory check)")
    if num_tokens * num_experts > INT_MAX:
        raise RuntimeError(f"num_tokens * num_experts exceeds INT_MAX (kernel uses int offsets), got "
                           f"{num_tokens * num_experts}")


def check_format(routing_map_format: int) -> None:
    if routing_map_format not in (BYTEMAP, BITMAP_U8):
        raise RuntimeError(f"routing_map_format must be BYTEMAP (0) or BITMAP_U8 (1), got {int(routing_map_format)}")


def check_probs_dtype(t: torch.Tensor) -> None:
    if t.dtype not in PROBS_DTYPES:
        raise RuntimeError(f"Unsupported router probs dtype {t.dtype}. Expected one of: Float32, Float16, BFloat16.")


def score_function_value(score_function: str) -> int:
    if score_function not in SCORE_FUNCTIONS:
        raise RuntimeError("score_function must be softmax, sigmoid or sqrtsoftplus for router fusion, got "
                           f"{score_function}")
    return SCORE_FUNCTIONS[score_function]


def check_dense_indices(indices: torch.Tensor, leading: tuple[int, ...], topk: int) -> None:
    """check_dense_topk_indices (the emulated device is the only one: its device checks hold)."""
    if not indices.is_contiguous():
        raise RuntimeError("topk_indices must be contiguous")
    if indices.dtype not in INDEX_DTYPES:
        raise RuntimeError(f"topk_indices dtype must be int16, int32, or int64, got {indices.dtype}")
    if tuple(indices.shape) != (*leading, topk):
        raise RuntimeError(f"topk_indices shape must be [*leading_dims, topk]={[*leading, topk]}, got "
                           f"{list(indices.shape)}")


@functools.cache
def radix_threshold(kernel_file: str) -> int:
    """get_radix_topk_threshold(): NVTE_RADIX_TOPK_THRESHOLD, read once per translation unit (a static local)."""
    return int(os.environ.get("NVTE_RADIX_TOPK_THRESHOLD") or 16)


def _exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x.double()).float()


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + _exp(-x))


def sqrtsoftplus(x: torch.Tensor) -> torch.Tensor:
    """sqrtf correctly rounded through fp64 (torch's CPU fp32 sqrt is not, for about 15% of inputs here)."""
    return torch.sqrt(torch.where(x > 20.0, x, torch.log1p(_exp(x).double()).float()).double()).float()


def sigmoid_bwd(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return grad * y * (1.0 - y)


def sqrtsoftplus_bwd(grad: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    denom = 2.0 * y + EPSILON
    return grad * torch.where(x > 20.0, 1.0 / denom, sigmoid(x) / denom)


def normalize_bwd(grad: torch.Tensor, routed: torch.Tensor, sum_act: torch.Tensor, sum_grad_act: torch.Tensor):
    """normalize_bwd_scalar: grad / d - sum_grad_act / (d d), d = sum_act + 1e-20; 0 off the routed experts."""
    denom = (sum_act + EPSILON).unsqueeze(-1)
    return torch.where(routed, grad / denom - sum_grad_act.unsqueeze(-1) / (denom * denom), 0.0)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """apply_softmax_on_float over the last dimension (fp32)."""
    lanes = reduction_order.LANES
    vals = reduction_order.lanes(x, float("-inf")).transpose(-1, -2)  # [..., step, lane]
    valid = reduction_order.lanes(torch.ones_like(x, dtype=torch.bool), False).transpose(-1, -2)
    top = torch.full(vals[..., 0, :].shape, float("-inf"), dtype=torch.float32, device=EMULATED)
    total = torch.zeros_like(top)
    for j in range(vals.shape[-2]):
        v, ok = vals[..., j, :], valid[..., j, :]
        higher = ok & (v > top)
        total = torch.where(higher, total * _exp(top - v), total)
        top = torch.where(higher, v, top)
        total = torch.where(ok, total + _exp(v - top), total)
    index = torch.arange(lanes, device=EMULATED)
    for mask in (16, 8, 4, 2, 1):
        other_top, other_total = top[..., index ^ mask], total[..., index ^ mask]
        merged = torch.fmax(top, other_top)
        mine = torch.where(top > float("-inf"), _exp(top - merged), 0.0)
        theirs = torch.where(other_top > float("-inf"), _exp(other_top - merged), 0.0)
        total = torch.where(merged > float("-inf"), total * mine + other_total * theirs, total)
        top = merged
    lane = torch.arange(x.shape[-1], device=EMULATED) % lanes
    return _exp(x - top[..., lane]) * (1.0 / total)[..., lane]


def ordered_key(x: torch.Tensor) -> torch.Tensor:
    """float_to_ordered_uint (utils.cuh), shifted to int64: the fp32 bit patterns in the order of their values."""
    bits = x.contiguous().view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)


@functools.cache
def naive_tie_rank(n: int) -> torch.Tensor:
    """The naive selection's preference among equal scores (smaller first): bit-reversed lane, then loop step."""
    i = torch.arange(n, device=EMULATED)
    lane = i % reduction_order.LANES
    reversed_lane = sum(((lane >> b) & 1) << (4 - b) for b in range(5))
    return reversed_lane * -(-n // reduction_order.LANES) + i // reduction_order.LANES


def select(scores: torch.Tensor, k: int, radix: bool, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_and_mask over the last dimension of `scores` [B, n] fp32: (experts int64 [B, k], their scores), in the
    kernel's order (naive: by value, then tie rank; radix: the larger ones by index, then the equal ones by index).
    Rows without equal scores among their top k + 1 take torch.topk's; the others, the order written out in full."""
    if bool(torch.isnan(scores).any()):
        refuse(f"tex.{name} with NaN router scores (the kernel's selection then depends on NaN bit patterns)")
    values, experts = scores.topk(min(k + 1, scores.shape[-1]), -1)
    tied = (values[:, 1:] == values[:, :-1]).any(-1)
    experts = experts[:, :k]
    if radix:  # distinct values: the k - 1 larger ones by index, then the k-th
        experts = torch.cat([experts[:, :-1].sort(-1).values, experts[:, -1:]], -1)
    if bool(tied.any()):
        rows = tied.nonzero().squeeze(1)
        experts = experts.index_put((rows,), _select_with_ties(scores[rows], k, radix))
    values = scores.gather(-1, experts)
    if not radix and bool((values == float("-inf")).any()):
        refuse(f"tex.{name} whose naive top-k selection reaches -inf scores")
    return experts, values


def _select_with_ties(scores: torch.Tensor, k: int, radix: bool) -> torch.Tensor:
    n = scores.shape[-1]
    rank = torch.arange(n, device=EMULATED) if radix else naive_tie_rank(n)
    shift = int(rank.max()).bit_length()
    key = ordered_key(scores if radix else scores + 0.0)  # the naive selection's comparisons: -0 == +0
    experts = ((key << shift) | ((1 << shift) - 1 - rank)).topk(k, -1).indices
    if radix:
        chosen = key.gather(-1, experts)
        last = chosen == chosen.min(-1, keepdim=True).values
        experts = experts.gather(-1, torch.argsort(last * n + experts, -1))
    return experts


def routing_map(experts: torch.Tensor, num_experts: int, routing_map_format: int) -> torch.Tensor:
    """The selected experts [T, k] as a BYTEMAP or BITMAP_U8 routing map [T, ...]."""
    routed = torch.zeros(experts.shape[0], num_experts, dtype=torch.bool, device=EMULATED)
    routed.scatter_(1, experts, True)
    if routing_map_format == BYTEMAP:
        return routed
    padded = torch.nn.functional.pad(routed, (0, -num_experts % 8)).reshape(experts.shape[0], -1, 8)
    return (padded.to(torch.int32) << torch.arange(8, dtype=torch.int32, device=EMULATED)).sum(-1).to(torch.uint8)


def routed_from_map(routing: torch.Tensor, num_tokens: int, num_experts: int, routing_map_format: int):
    """A BYTEMAP (any nonzero byte routes) or BITMAP_U8 routing map as bool [T, E]."""
    if routing.element_size() != 1 or not routing.is_contiguous():
        refuse(f"a {routing.dtype} (or strided) routing map read as the kernel's bytes")
    data = routing.view(torch.uint8).reshape(num_tokens, -1)
    if routing_map_format == BYTEMAP:
        return data != 0
    bits = (data.unsqueeze(-1).to(torch.int32) >> torch.arange(8, dtype=torch.int32, device=EMULATED)) & 1
    return bits.reshape(num_tokens, -1)[:, :num_experts] != 0
