"""TE's fused MoE router aux loss: tex.fused_score_for_moe_aux_loss_fwd / _bwd, fused_moe_aux_loss_fwd, its CUDA-graph
form fused_moe_aux_loss_fwd_graph_safe and fused_moe_aux_loss_bwd, as csrc/extensions/router.cpp,
common/fused_router/fused_score_for_moe_aux_loss.cu and fused_moe_aux_loss.cu (TE 2.18 to 2.20) compute them; the
score functions, softmax and top-k are router_scores.py's.

- Scores for the aux loss, per token in fp32: softmax over all experts, or sigmoid / sqrtsoftplus over their warp sum
  (strided lanes, butterfly) + 1e-20; the top-k routing map of those scores; scores fp32; intermediate_output the
  softmax or sigmoid output, or the logits (sqrtsoftplus). Backward from the fp32 grad_scores: the softmax backward,
  or the normalization backward over every expert then the score function's; sums as the kernels make them (each
  lane's strided partial sums, `acc += g * act` as one FMA, the butterfly).
- Aux loss: coefficient C = num_experts * coeff / topk / total_num_tokens / total_num_tokens in fp32 (on the host, or
  on the device from the int64 tensor in the graph-safe form); 2 * 132 blocks (the emulated device's SMs) of
  roundup32(min(1024, cols)) threads: block b sums rows b, b + 264, ... per column from 0, times the column's
  tokens_per_expert (fp32), each thread sums its columns t, t + block size, ... from 0, the first warp sums those
  (strided lanes, butterfly); each block's sum * C added into the fp32 accumulator. The GPU adds the blocks' sums
  by atomicAdd in whatever order they finish: the emulation adds them in block order (one of the GPU's possible
  results, which vary run to run in their last bits). The loss in the probs' dtype; Const_buf [C, sum].
  Backward: grad_probs[r, c] = C * tokens_per_expert[c] * grad_aux_loss, in fp32, stored in grad_aux_loss' dtype.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from te_verify.te.tecpu import router_scores as rs
from te_verify.te.tecpu.device import EMULATED, SM_COUNT
from te_verify.te.tecpu.reduction_order import lanes, running_sum, warp_sum, xor_butterfly
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.writes import write

KERNEL_FILE = "fused_score_for_moe_aux_loss.cu"  # its own static radix threshold
TOKENS_PER_EXPERT_DTYPES = (torch.int16, torch.int32, torch.int64, torch.bfloat16, torch.float32)


def fused_score_for_moe_aux_loss_fwd(logits: torch.Tensor, topk: int, score_function: str,
                                     routing_map_format: int = rs.BYTEMAP):
    """(scores fp32, routing map, intermediate_output)."""
    name = "fused_score_for_moe_aux_loss_fwd"
    rs.check_format(routing_map_format)
    if logits.dim() < 1:
        raise RuntimeError("logits must have at least 1 dim")
    if not logits.is_contiguous():
        raise RuntimeError("logits must be contiguous")
    num_experts = logits.shape[-1]
    num_tokens = logits.numel() // max(num_experts, 1)
    if not (num_tokens > 0 and num_experts > 0):
        raise RuntimeError("num_tokens and num_experts must be greater than 0")
    if topk <= 0:
        raise RuntimeError("topk must be greater than 0")
    sfn = rs.score_function_value(score_function)
    rs.check_probs_dtype(logits)
    if topk > num_experts:
        raise RuntimeError(f"topk must be in [1, num_experts], got topk={topk} num_experts={num_experts}")
    rs.check_experts(num_experts, num_tokens, name)
    x = logits.reshape(num_tokens, num_experts).float()
    if sfn == rs.SOFTMAX:
        scores = intermediate = rs.softmax(x)
    else:
        activated = rs.sigmoid(x) if sfn == rs.SIGMOID else rs.sqrtsoftplus(x)
        intermediate = activated if sfn == rs.SIGMOID else x
        scores = activated / (warp_sum(activated) + rs.EPSILON).unsqueeze(1)
    radix = topk >= rs.radix_threshold(KERNEL_FILE) and num_experts <= 8160
    experts, _ = rs.select(scores, topk, radix, name)
    routing = rs.routing_map(experts, num_experts, routing_map_format)
    return (scores.reshape(logits.shape), routing.reshape(*logits.shape[:-1], routing.shape[-1]),
            intermediate.reshape(logits.shape))


def fused_score_for_moe_aux_loss_bwd(intermediate_output: torch.Tensor, grad_scores: torch.Tensor,
                                     grad_logits: torch.Tensor, topk: int, score_function: str) -> None:
    """grad_logits, written in place."""
    name = "fused_score_for_moe_aux_loss_bwd"
    if grad_scores.dim() < 1:
        raise RuntimeError("grad_scores must have at least 1 dim")
    if not grad_scores.is_contiguous():
        raise RuntimeError("grad_scores must be contiguous")
    if not grad_logits.is_contiguous():
        raise RuntimeError("grad_logits must be contiguous")
    num_experts = grad_scores.shape[-1]
    num_tokens = grad_scores.numel() // max(num_experts, 1)
    sfn = rs.score_function_value(score_function)
    rs.check_probs_dtype(grad_logits)
    if num_experts <= 0:
        raise RuntimeError(f"num_experts must be positive, got {num_experts}")
    rs.check_experts(num_experts, num_tokens, name)
    numel = num_tokens * num_experts
    if num_tokens == 0 or grad_scores.dtype != torch.float32 or grad_logits.numel() != numel:
        refuse(f"tex.{name} over no tokens, or with grad_scores not fp32 or grad_logits of another size (the kernel "
               "reads fp32 [tokens, experts])")
    if intermediate_output.dtype != torch.float32 or intermediate_output.numel() != numel:
        refuse(f"tex.{name} with an intermediate_output other than fp32 [tokens, experts]")
    g = grad_scores.reshape(num_tokens, num_experts)
    act = intermediate_output.reshape(num_tokens, num_experts)
    if sfn == rs.SOFTMAX:
        out = act * (g - warp_sum(g, times=act).unsqueeze(1))
    else:
        value = act if sfn == rs.SIGMOID else rs.sqrtsoftplus(act)
        every = torch.ones_like(g, dtype=torch.bool)
        out = rs.normalize_bwd(g, every, warp_sum(value), warp_sum(g, times=value))
        out = rs.sigmoid_bwd(out, act) if sfn == rs.SIGMOID else rs.sqrtsoftplus_bwd(out, act, value)
    write(grad_logits, out.to(grad_logits.dtype).reshape(grad_logits.shape))


def _tokens_per_expert(tokens_per_expert: torch.Tensor, num_cols: int) -> torch.Tensor:
    if tokens_per_expert.dtype not in TOKENS_PER_EXPERT_DTYPES:
        raise RuntimeError(f"Unsupported router index dtype {tokens_per_expert.dtype}. Expected one of: Int16, Int32, "
                           "Int64, BFloat16, Float32.")
    if not tokens_per_expert.is_contiguous() or tokens_per_expert.numel() < num_cols:
        refuse("tex.fused_moe_aux_loss with tokens_per_expert strided or shorter than num_cols")
    return tokens_per_expert.reshape(-1)[:num_cols].float()


def _coefficient(num_experts: int, coeff: float, topk: int, total_num_tokens: torch.Tensor) -> torch.Tensor:
    f32 = dict(dtype=torch.float32, device=EMULATED)
    c = torch.tensor(float(num_experts), **f32) * torch.tensor(coeff, **f32) / torch.tensor(float(topk), **f32)
    return c / total_num_tokens / total_num_tokens


def _aux_loss(probs, tokens_per_expert, total_num_tokens, num_experts, num_rows, num_cols, topk, coeff):
    rs.check_probs_dtype(probs)
    counts = _tokens_per_expert(tokens_per_expert, num_cols)
    if num_cols <= 0:
        raise RuntimeError(f"num_cols must be positive, got {num_cols}")
    if num_cols % num_experts:
        raise RuntimeError(f"Number of input columns ({num_cols}) must be a multiple of number of experts "
                           f"({num_experts}).")
    if not probs.is_contiguous() or probs.numel() < num_rows * num_cols:
        refuse("tex.fused_moe_aux_loss with probs strided or smaller than num_rows * num_cols")
    c = _coefficient(num_experts, coeff, topk, total_num_tokens)
    blocks, threads = 2 * SM_COUNT, -(-min(1024, num_cols) // 32) * 32
    rows = probs.reshape(-1)[:num_rows * num_cols].reshape(num_rows, num_cols).float()
    rows = torch.nn.functional.pad(rows, (0, -num_cols % threads, 0, -num_rows % blocks))
    column_sums = running_sum(rows.reshape(-1, blocks, rows.shape[1]), 0)  # [block, column]
    column_sums = column_sums * torch.nn.functional.pad(counts, (0, -num_cols % threads))
    thread_sums = running_sum(column_sums.reshape(blocks, -1, threads), 1)  # [block, thread]
    block_sums = xor_butterfly(running_sum(lanes(thread_sums, 0.0), -1))
    total = running_sum((block_sums * c).unsqueeze(0), 1)[0]
    return total.to(probs.dtype), torch.stack([c, total])


def fused_moe_aux_loss_fwd(probs: torch.Tensor, tokens_per_expert: torch.Tensor, total_num_tokens: int,
                           num_experts: int, num_rows: int, num_cols: int, topk: int, coeff: float):
    """(aux_loss 0-dim in probs' dtype, Const_buf fp32 [2])."""
    if topk <= 0:
        raise RuntimeError("topk must be greater than 0")
    if total_num_tokens <= 0:
        raise RuntimeError("total_num_tokens must be greater than 0")
    if num_experts <= 0:
        raise RuntimeError("num_experts must be greater than 0")
    tokens = torch.tensor(float(total_num_tokens), dtype=torch.float32, device=EMULATED)
    return _aux_loss(probs, tokens_per_expert, tokens, num_experts, num_rows, num_cols, topk, coeff)


def fused_moe_aux_loss_fwd_graph_safe(probs: torch.Tensor, tokens_per_expert: torch.Tensor,
                                      total_num_tokens: torch.Tensor, num_experts: int, num_rows: int, num_cols: int,
                                      topk: int, coeff: float):
    """As fused_moe_aux_loss_fwd, total_num_tokens an int64 tensor of one element."""
    if topk <= 0:
        raise RuntimeError("topk must be greater than 0")
    if num_experts <= 0:
        raise RuntimeError("num_experts must be greater than 0")
    if total_num_tokens.numel() != 1:
        raise RuntimeError(f"total_num_tokens must contain exactly one element; got {total_num_tokens.numel()}")
    if total_num_tokens.dtype != torch.int64:
        raise RuntimeError(f"total_num_tokens must be int64; got {total_num_tokens.dtype}")
    tokens = total_num_tokens.reshape(()).float()
    return _aux_loss(probs, tokens_per_expert, tokens, num_experts, num_rows, num_cols, topk, coeff)


def fused_moe_aux_loss_bwd(Const_buf: torch.Tensor, tokens_per_expert: torch.Tensor, num_rows: int, num_cols: int,
                           grad_aux_loss: torch.Tensor) -> torch.Tensor:
    """grad_probs [num_rows, num_cols] in grad_aux_loss' dtype."""
    rs.check_probs_dtype(grad_aux_loss)
    counts = _tokens_per_expert(tokens_per_expert, num_cols)
    if Const_buf.dtype != torch.float32 or Const_buf.numel() < 1 or num_rows <= 0:
        refuse("tex.fused_moe_aux_loss_bwd with Const_buf not fp32 or no rows (the kernel's grid)")
    grad = Const_buf.reshape(-1)[0] * counts * grad_aux_loss.reshape(-1)[0].float()
    return grad.to(grad_aux_loss.dtype).expand(num_rows, num_cols).contiguous()


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    return rs.since_verified(fused_score_for_moe_aux_loss_fwd, fused_score_for_moe_aux_loss_bwd,
                             fused_moe_aux_loss_fwd, fused_moe_aux_loss_fwd_graph_safe, fused_moe_aux_loss_bwd)
