"""TE's fused MoE router top-k: tex.fused_topk_with_score_function_fwd, its QB form
fused_topk_with_score_function_qb_fwd (TE >= 2.20) and fused_topk_with_score_function_bwd, as
csrc/extensions/router.cpp and common/fused_router/fused_topk_with_score_function.cu (TE 2.18 to 2.20) compute them;
the shared numerics (score functions, softmax, selection, maps) and what is refused are router_scores.py's.

Per token, in fp32 (logits read as fp32; probs written in the logits' dtype, intermediate_output fp32):
- scores: softmax (before top-k with use_pre_softmax, else after it, over the k selected logits), sigmoid, or
  sqrtsoftplus; intermediate_output keeps what backward reads (the softmax output, -inf off the selected experts
  after a post-softmax; the sigmoid output; the logits for sqrtsoftplus); expert_bias (sigmoid, sqrtsoftplus) is added
  for the selection and taken off the selected scores after it;
- grouped top-k (group_topk > 0): each group's top (topk / group_topk) scores summed in selection order, the top
  group_topk groups by that sum, then top-k over their experts (-inf elsewhere);
- sigmoid / sqrtsoftplus with topk > 1: the k scores over their warp sum (selection order, 32 lanes, butterfly) + 1e-20;
- probs = scaling_factor * score at the selected experts, 0 elsewhere; the routing map, or the selected experts in
  selection order in the caller's dense index tensor;
- QB: sigmoid with expert_bias; top-(k + 1), the cutoff the smallest biased score of them (equal ones: the largest
  expert) dropped; the cutoff per token; each expert's bin floor((cutoff - sigmoid - lower) * (num_bins / (upper -
  lower))), clamped (NaN to bin 0), counted into the histogram (both histogram modes count the same bins); bounds
  checked finite with lower < upper unless the caller validated them.
Backward, from grad_probs * scaling_factor: normalization backward over the routed experts, the softmax backward
(post: routed only; pre: all experts), the score function's backward. Its sums are the kernels': each lane's strided
partial sums, `acc += g * act` as one FMA, then the butterfly; over the experts in order (routing map) or the k
dense indices in order (with_indices kernel).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from te_verify.te.tecpu import router_scores as rs
from te_verify.te.tecpu.device import EMULATED
from te_verify.te.tecpu.reduction_order import running_sum, warp_sum
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.writes import write

KERNEL_FILE = "fused_topk_with_score_function.cu"  # its own static radix threshold
TWO_KERNEL, FUSED_ATOMIC = 0, 1  # NVTEQBHistogramMode


def _shape(t: torch.Tensor, what: str) -> tuple[tuple[int, ...], int, int]:
    if t.dim() < 1:
        raise RuntimeError(f"{what} must have at least 1 dim")
    if not t.is_contiguous():
        raise RuntimeError(f"{what} must be contiguous")
    leading, num_experts = tuple(t.shape[:-1]), t.shape[-1]
    num_tokens = int(torch.Size(leading).numel())
    if not (num_tokens > 0 and num_experts > 0):
        raise RuntimeError("num_tokens and num_experts must be greater than 0")
    return leading, num_tokens, num_experts


def _check_groups(topk: int, num_experts: int, num_groups: int, group_topk: int) -> None:
    if group_topk <= 0:
        return
    if topk % group_topk:
        raise RuntimeError(f"topk must be divisible by group_topk, got topk={topk} group_topk={group_topk}")
    if num_groups <= 0:
        raise RuntimeError(f"num_groups must be positive when group_topk > 0, got {num_groups}")
    if group_topk > num_groups:
        raise RuntimeError(f"group_topk must be <= num_groups, got group_topk={group_topk} num_groups={num_groups}")
    if num_experts % num_groups:
        raise RuntimeError(f"num_experts must be divisible by num_groups, got num_experts={num_experts} "
                           f"num_groups={num_groups}")
    if topk // group_topk > num_experts // num_groups:
        raise RuntimeError(f"per-group topk must be <= group size, got per_group_topk={topk // group_topk} "
                           f"group_size={num_experts // num_groups}")


def _select(scores: torch.Tensor, k: int, num_groups: int, group_topk: int, radix: bool, name: str):
    if group_topk <= 0:
        return rs.select(scores, k, radix, name)
    tokens, experts = scores.shape
    size = experts // num_groups
    _, best = rs.select(scores.reshape(tokens * num_groups, size), k // group_topk, radix, name)
    group_scores = running_sum(best.reshape(tokens, num_groups, -1), -1)
    groups, _ = rs.select(group_scores, group_topk, radix, name)
    kept = torch.zeros(tokens, num_groups, dtype=torch.bool, device=EMULATED).scatter_(1, groups, True)
    return rs.select(torch.where(kept.repeat_interleave(size, 1), scores, float("-inf")), k, radix, name)


def _qb_cutoff(experts: torch.Tensor, scores: torch.Tensor):
    """extract_qb_cutoff_and_compact: the smallest of the k + 1 scores (equal ones: the largest expert) is the cutoff,
    dropped from the selection, which keeps its order."""
    value = scores + 0.0
    smallest = value.min(-1, keepdim=True).values
    dropped = torch.where(value == smallest, experts, -1).max(-1, keepdim=True).values
    kept = experts != dropped
    k = experts.shape[1] - 1
    cutoff = scores.gather(1, (experts == dropped).to(torch.int8).argmax(1, keepdim=True)).squeeze(1)
    return cutoff, experts[kept].reshape(-1, k), scores[kept].reshape(-1, k)


def _qb_histogram(raw: torch.Tensor, cutoff: torch.Tensor, bin_bounds: torch.Tensor, num_bins: int) -> torch.Tensor:
    lower, upper = bin_bounds[0], bin_bounds[1]
    scale = torch.tensor(float(num_bins), dtype=torch.float32, device=EMULATED) / (upper - lower)
    position = (cutoff.unsqueeze(1) - raw - lower) * scale
    bins = torch.nan_to_num(torch.floor(position).double(), nan=0.0).clamp(0, num_bins - 1).long()
    flat = bins + torch.arange(raw.shape[1], device=EMULATED) * num_bins
    return torch.bincount(flat.reshape(-1), minlength=raw.shape[1] * num_bins).reshape(raw.shape[1], num_bins)


def _route(logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor, sfn, expert_bias, qb, name):
    """(probs fp32 [T, E], selected experts [T, topk], intermediate_output [T, E], cutoff [T] or None)."""
    x = logits.float()
    if sfn == rs.SOFTMAX:
        scores = rs.softmax(x) if use_pre_softmax else x
        intermediate = scores if use_pre_softmax else torch.full_like(x, float("-inf"))
    elif sfn == rs.SIGMOID:
        scores = intermediate = rs.sigmoid(x)
    else:
        intermediate, scores = x, rs.sqrtsoftplus(x)
    bias = expert_bias.float() if expert_bias is not None and sfn != rs.SOFTMAX else None
    if bias is not None:
        scores = scores + bias
    radix = topk >= rs.radix_threshold(KERNEL_FILE) and x.shape[1] <= 8160
    experts, chosen = _select(scores, topk + qb, num_groups, group_topk, radix, name)
    cutoff = None
    if qb:
        cutoff, experts, chosen = _qb_cutoff(experts, chosen)
    if bias is not None:
        chosen = chosen - bias[experts]
    if sfn == rs.SOFTMAX and not use_pre_softmax:
        chosen = rs.softmax(chosen)
        intermediate = intermediate.scatter(1, experts, chosen)
    if sfn != rs.SOFTMAX and topk > 1:
        chosen = chosen / (warp_sum(chosen) + rs.EPSILON).unsqueeze(1)
    factor = torch.tensor(1.0 if scaling_factor is None else scaling_factor, dtype=torch.float32, device=EMULATED)
    probs = torch.zeros_like(x).scatter_(1, experts, factor * chosen)
    return probs, experts, intermediate, cutoff


def _outputs(probs, experts, intermediate, logits, leading, routing_map_format, topk_indices):
    num_experts = logits.shape[-1]
    if topk_indices is not None:
        routing = write(topk_indices, experts.reshape(topk_indices.shape).to(topk_indices.dtype))
    else:
        routing = rs.routing_map(experts, num_experts, routing_map_format)
        routing = routing.reshape(*leading, routing.shape[-1])
    return probs.to(logits.dtype).reshape(logits.shape), routing, intermediate.reshape(logits.shape)


def _check_indices(topk_indices, routing_map_format, leading, topk, num_experts, message):
    if topk_indices is None:
        return
    if routing_map_format != rs.BYTEMAP:
        raise RuntimeError(message)
    rs.check_dense_indices(topk_indices, leading, topk)
    if topk_indices.dtype == torch.int16 and num_experts > 32767:
        raise RuntimeError(f"int16 topk indices require num_experts <= 32767, got {num_experts}")


def fused_topk_with_score_function_fwd(logits: torch.Tensor, topk: int, use_pre_softmax: bool,
                                       num_groups: Optional[int], group_topk: Optional[int],
                                       scaling_factor: Optional[float], score_function: str,
                                       expert_bias: Optional[torch.Tensor], routing_map_format: int = rs.BYTEMAP,
                                       topk_indices: Optional[torch.Tensor] = None):
    """(probs, routing map or topk_indices, intermediate_output)."""
    name = "fused_topk_with_score_function_fwd"
    rs.check_format(routing_map_format)
    leading, num_tokens, num_experts = _shape(logits, "logits")
    if not 0 < topk <= num_experts:
        raise RuntimeError(f"topk must be in [1, num_experts], got topk={topk} num_experts={num_experts}")
    if expert_bias is not None:
        if score_function not in ("sigmoid", "sqrtsoftplus"):
            raise RuntimeError("score_function must be sigmoid or sqrtsoftplus when expert_bias is not None")
        if expert_bias.dtype != torch.float32:
            raise RuntimeError("expert_bias must be a float32 tensor")
    sfn = rs.score_function_value(score_function)
    use_pre_softmax = bool(use_pre_softmax) and sfn == rs.SOFTMAX
    _check_indices(topk_indices, routing_map_format, leading, topk, num_experts,
                   "topk_indices output cannot be combined with non-default routing_map_format; dense top-k "
                   "indices are returned instead of a routing map.")
    if expert_bias is not None and tuple(expert_bias.shape) != (num_experts,):
        raise RuntimeError(f"expert_bias shape must be [num_experts]=[{num_experts}], got {list(expert_bias.shape)}")
    rs.check_probs_dtype(logits)
    rs.check_experts(num_experts, num_tokens, name)
    num_groups, group_topk = -1 if num_groups is None else num_groups, -1 if group_topk is None else group_topk
    _check_groups(topk, num_experts, num_groups, group_topk)
    probs, experts, intermediate, _ = _route(logits.reshape(num_tokens, num_experts), topk, use_pre_softmax,
                                             num_groups, group_topk, scaling_factor, sfn, expert_bias, 0, name)
    return _outputs(probs, experts, intermediate, logits, leading, routing_map_format, topk_indices)


def fused_topk_with_score_function_qb_fwd(logits: torch.Tensor, topk: int, scaling_factor: Optional[float],
                                          expert_bias: torch.Tensor, routing_map_format: int,
                                          topk_indices: Optional[torch.Tensor], histogram: torch.Tensor,
                                          bin_bounds: torch.Tensor, histogram_mode: int,
                                          bin_bounds_validated: bool = False):
    """(probs, routing map or topk_indices, intermediate_output, cutoff, histogram): histogram accumulated in place."""
    name = "fused_topk_with_score_function_qb_fwd"
    rs.check_format(routing_map_format)
    leading, num_tokens, num_experts = _shape(logits, "logits")
    if not 0 < topk < num_experts:
        raise RuntimeError(f"QB topk must be in [1, num_experts), got topk={topk} num_experts={num_experts}")
    if not expert_bias.is_contiguous():
        raise RuntimeError("QB expert_bias must be a contiguous CUDA tensor")
    if expert_bias.dtype != torch.float32:
        raise RuntimeError("QB expert_bias must have float32 dtype")
    if tuple(expert_bias.shape) != (num_experts,):
        raise RuntimeError("QB expert_bias must have shape [num_experts]")
    if not histogram.is_contiguous():
        raise RuntimeError("QB histogram must be a contiguous CUDA tensor")
    if histogram.dtype != torch.int32:
        raise RuntimeError("QB histogram must have int32 dtype")
    if histogram.dim() != 2 or histogram.shape[0] != num_experts or histogram.shape[1] <= 0:
        raise RuntimeError("QB histogram must have shape [num_experts, num_bins]")
    if not bin_bounds.is_contiguous():
        raise RuntimeError("QB bin_bounds must be a contiguous CUDA tensor")
    if bin_bounds.dtype != torch.float32 or tuple(bin_bounds.shape) != (2,):
        raise RuntimeError("QB bin_bounds must be float32 with shape [2]")
    if int(histogram_mode) not in (TWO_KERNEL, FUSED_ATOMIC):
        raise RuntimeError(f"Unsupported QB histogram mode: {int(histogram_mode)}")
    _check_indices(topk_indices, routing_map_format, leading, topk, num_experts,
                   "dense Top-k indices cannot be combined with a non-default routing-map format")
    if not bin_bounds_validated:
        lower, upper = bin_bounds.tolist()
        if not (torch.isfinite(bin_bounds).all() and lower < upper):
            raise RuntimeError(f"QB bin_bounds values must be finite with lower < upper, got [{lower:g}, {upper:g}]")
    rs.check_probs_dtype(logits)
    rs.check_experts(num_experts, num_tokens, name)
    probs, experts, intermediate, cutoff = _route(logits.reshape(num_tokens, num_experts), topk, False, -1, -1,
                                                  scaling_factor, rs.SIGMOID, expert_bias, 1, name)
    counts = _qb_histogram(intermediate, cutoff, bin_bounds, histogram.shape[1])
    write(histogram, histogram + counts.to(torch.int32))
    return (*_outputs(probs, experts, intermediate, logits, leading, routing_map_format, topk_indices), cutoff,
            histogram)


def _backward(routed, experts, intermediate, grad, topk, use_pre_softmax, sfn):
    """grad_logits fp32 [T, E] from grad_probs * scaling_factor (`grad`): the routing-map kernel (`routed` [T, E])
    or, given `experts` [T, k], the selected-indices kernel."""
    act = intermediate if experts is None else intermediate.gather(1, experts)
    g = grad if experts is None else grad.gather(1, experts)
    on = routed if experts is None else torch.ones_like(g, dtype=torch.bool)
    value = rs.sqrtsoftplus(act) if sfn == rs.SQRTSOFTPLUS else act
    if sfn != rs.SOFTMAX and topk > 1:
        g = rs.normalize_bwd(g, on, warp_sum(value, on), warp_sum(g, on, times=value))
    if sfn == rs.SOFTMAX and use_pre_softmax and experts is None:  # every expert's act; 0 grads off the routed
        g = torch.where(on, g, 0.0)
        dot = warp_sum(g, times=act).unsqueeze(1)
        g = act * (g - dot)
    elif sfn == rs.SOFTMAX:
        dot = warp_sum(g, on, times=act).unsqueeze(1)
        g = torch.where(on, act * (g - dot), 0.0)
    else:
        g = torch.where(on, g, 0.0)
        g = rs.sigmoid_bwd(g, act) if sfn == rs.SIGMOID else rs.sqrtsoftplus_bwd(g, act, value)
    if experts is None:
        return g
    base = intermediate * (0.0 - dot) if sfn == rs.SOFTMAX and use_pre_softmax else torch.zeros_like(intermediate)
    return base.scatter(1, experts, g)


def fused_topk_with_score_function_bwd(routing_map: torch.Tensor, intermediate_output: torch.Tensor,
                                       grad_probs: torch.Tensor, grad_logits: torch.Tensor, topk: int,
                                       use_pre_softmax: bool, scaling_factor: Optional[float], score_function: str,
                                       use_dense_indices: bool = False, routing_map_format: int = rs.BYTEMAP) -> None:
    """grad_logits (written in place, in grad_probs' dtype)."""
    name = "fused_topk_with_score_function_bwd"
    if use_dense_indices and routing_map_format != rs.BYTEMAP:
        raise RuntimeError("use_dense_indices cannot be combined with non-default routing_map_format; dense top-k "
                           "indices are consumed instead of a routing map.")
    rs.check_format(routing_map_format)
    if not grad_logits.is_contiguous():
        raise RuntimeError("grad_logits must be contiguous")
    leading, num_tokens, num_experts = _shape(grad_probs, "grad_probs")
    if not 0 < topk <= num_experts:
        raise RuntimeError(f"topk must be in [1, num_experts], got topk={topk} num_experts={num_experts}")
    if use_dense_indices:
        rs.check_dense_indices(routing_map, leading, topk)
    sfn = rs.score_function_value(score_function)
    rs.check_probs_dtype(grad_probs)
    rs.check_experts(num_experts, num_tokens, name)
    _check_read(intermediate_output, grad_logits, grad_probs, num_tokens * num_experts, name)
    factor = torch.tensor(1.0 if scaling_factor is None else scaling_factor, dtype=torch.float32, device=EMULATED)
    grad = grad_probs.reshape(num_tokens, num_experts).float() * factor
    intermediate = intermediate_output.reshape(num_tokens, num_experts)
    if use_dense_indices:
        experts = routing_map.reshape(num_tokens, topk).long()
        if bool(((experts < 0) | (experts >= num_experts)).any()) or bool(
                (experts.sort(1).values.diff(dim=1) == 0).any()):
            refuse(f"tex.{name} with dense indices out of range or repeated within a token")
        out = _backward(None, experts, intermediate, grad, topk, use_pre_softmax, sfn)
    else:
        routed = rs.routed_from_map(routing_map, num_tokens, num_experts, routing_map_format)
        out = _backward(routed, None, intermediate, grad, topk, use_pre_softmax, sfn)
    write(grad_logits, out.to(grad_logits.dtype).reshape(grad_logits.shape))


def _check_read(intermediate: torch.Tensor, grad_logits: torch.Tensor, grad: torch.Tensor, numel: int, name: str):
    """What the binding hands the kernel as raw pointers must be what the kernel reads."""
    if intermediate.dtype != torch.float32 or not intermediate.is_contiguous() or intermediate.numel() != numel:
        refuse(f"tex.{name} with an intermediate_output other than contiguous fp32 [tokens, experts]")
    if grad_logits.dtype != grad.dtype or grad_logits.numel() != numel:
        refuse(f"tex.{name} with grad_logits of another dtype or size than the gradient it is written as")


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    return rs.since_verified(fused_topk_with_score_function_fwd, fused_topk_with_score_function_qb_fwd,
                             fused_topk_with_score_function_bwd)
