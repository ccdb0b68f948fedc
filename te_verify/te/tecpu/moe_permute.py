"""MoE token permutation by an index router map: tex.moe_permute_fwd, moe_permute_bwd, moe_unpermute_fwd and
moe_unpermute_bwd (csrc/extensions/permutation.cpp over common/permutation/permutation.cu, as in TE >= 2.16).

`te.moe_permute(..., map_type="index")` and `te.moe_unpermute` reach them (Megatron-core's MoE token dispatcher
with TE's fused permutation). The kernels' definitions, N tokens, each routed to topK experts:
- permute: the N * topK (token, k) pairs sorted stably by expert id read as uint32 (cub's radix sort; a negative id
  sorts last); the pair at sorted position p is output row p, or dropped (-1) when p >= num_out_tokens;
  row_id_map[k * N + t] holds it;
- unpermute: output[t] = sum over k, in k order, of input[row_id_map[k * N + t]] * prob[t, k], each product and sum
  in the data's dtype (the kernel's TCompute), the probability rounded to it first; dropped rows skipped;
- unpermute's backward: act_grad[row] = grad[t] * prob[t, k] in the data's dtype; prob_grad[t, k] the fp32 sum of
  grad[t] * input[row] (products in the data's dtype), in the kernel's order: 32 lanes, each summing its 16-byte
  chunks of the row in turn, then a butterfly over the lanes.
FP8 data (TCompute half, unpermute averaging by topK) is refused, and so are negative expert ids under TE < 2.16,
whose sort read the keys as int32 (negative ids first; TransformerEngine#2907 made them sort last).
"""
from __future__ import annotations

from typing import Any

import torch

from packaging.version import Version

from te_verify.te.tecpu import reduction_order
from te_verify.te.tecpu.device import EMULATED
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.surface import installed_te_version
from te_verify.te.tecpu.writes import write

COMPUTED = (torch.float32, torch.float16, torch.bfloat16)
LANES = reduction_order.LANES  # the backward kernel's threads per token: a warp
UINT32_KEYS_SINCE = Version("2.16")


def _check(x: torch.Tensor, what: str) -> None:
    if x.dtype not in COMPUTED:
        refuse(f"tex.{what} over {x.dtype} data")
    if x.dim() != 2:
        raise RuntimeError(f"{what}: expected a 2D [tokens, hidden] input, got shape {tuple(x.shape)}")
    if x.shape[1] % _per_load(x):
        refuse(f"tex.{what} with a hidden size ({x.shape[1]}) not a whole number of the kernel's 16-byte loads")


def _per_load(x: torch.Tensor) -> int:
    """Elements of x in one of the kernels' 16-byte loads."""
    return 16 // x.element_size()


def _workspace(max_expanded_token_num: int) -> list[torch.Tensor]:
    """The four buffers permutation.cpp allocates on the first call (the radix sort's temporary storage: none)."""
    i32 = dict(dtype=torch.int32, device=EMULATED)
    return [torch.empty(max_expanded_token_num, **i32), torch.arange(max_expanded_token_num, **i32),
            torch.empty(max_expanded_token_num, **i32), torch.empty(0, dtype=torch.int8, device=EMULATED)]


def moe_permute_fwd(input: torch.Tensor, dtype: Any, indices: torch.Tensor, num_out_tokens: int,
                    workspace: list[torch.Tensor], max_expanded_token_num: int,
                    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(permuted rows, row_id_map, workspace)."""
    _check(input, "moe_permute_fwd")
    num_tokens, top_k = indices.shape
    pairs = num_tokens * top_k
    workspace = workspace or _workspace(max_expanded_token_num)
    keys = indices.reshape(-1).to(torch.int64)
    if bool((keys < 0).any()):
        if installed_te_version() < UINT32_KEYS_SINCE:
            refuse(f"tex.moe_permute_fwd with negative expert ids under TE {installed_te_version()}")
    keys = keys & 0xFFFFFFFF  # the sort reads the int32 keys as uint32
    sorted_keys, sorted_rows = torch.sort(keys, stable=True)
    write(workspace[0][:pairs], sorted_keys.to(torch.int32))
    write(workspace[2][:pairs], sorted_rows.to(torch.int32))
    num_out_tokens = num_out_tokens if num_out_tokens > 0 else pairs
    position = torch.arange(pairs, device=EMULATED)
    row_id_map = torch.empty(pairs, dtype=torch.int32, device=EMULATED)
    row_id_map[(sorted_rows % top_k) * num_tokens + sorted_rows // top_k] = torch.where(
        position < num_out_tokens, position, -1).to(torch.int32)
    kept = min(num_out_tokens, pairs)
    output = torch.zeros(num_out_tokens, input.shape[1], dtype=input.dtype, device=EMULATED)
    output[:kept] = input[sorted_rows[:kept] // top_k]
    return output, row_id_map, workspace


def moe_unpermute_fwd(input: torch.Tensor, dtype: Any, row_id_map: torch.Tensor, prob: torch.Tensor,
                      num_tokens: int, topK: int) -> torch.Tensor:
    """[num_tokens, hidden]: each token's topK rows, weighted by prob where it is given, summed in k order."""
    _check(input, "moe_unpermute_fwd")
    rows = row_id_map.to(torch.int64).reshape(topK, num_tokens)
    weights = prob.to(input.dtype).reshape(num_tokens, topK) if prob.numel() else None
    total = torch.zeros(num_tokens, input.shape[1], dtype=input.dtype, device=EMULATED)
    for k in range(topK):
        kept = (rows[k] != -1)[:, None]
        term = input[rows[k].clamp(min=0)]
        if weights is not None:
            term = term * weights[:, k:k + 1]
        total = torch.where(kept, term, 0) if k == 0 else torch.where(kept, total + term, total)
    return total


def moe_permute_bwd(input: torch.Tensor, dtype: Any, row_id_map: torch.Tensor, prob: torch.Tensor,
                    num_tokens: int, topK: int) -> torch.Tensor:
    """permute's gradient is unpermute (permutation.cpp calls moe_unpermute_fwd)."""
    return moe_unpermute_fwd(input, dtype, row_id_map, prob, num_tokens, topK)


def lane_sum(products: torch.Tensor, chunk: int) -> torch.Tensor:
    """The backward kernel's fp32 sum of each row of `products` ([tokens, hidden] fp32): lane l sums the chunks of
    `chunk` elements l, l + 32, ... (its 16-byte loads) element by element, then the lanes combine by xor-shuffle
    (masks 16 .. 1)."""
    tokens, hidden = products.shape
    padded = torch.nn.functional.pad(products, (0, -hidden % (LANES * chunk))).reshape(tokens, -1, LANES, chunk)
    per_lane = padded.transpose(1, 2).reshape(tokens, LANES, -1)  # a lane's elements in the order it adds them
    return reduction_order.xor_butterfly(reduction_order.running_sum(per_lane, -1))


def moe_unpermute_bwd(input_bwd: torch.Tensor, input_fwd: torch.Tensor, dtype: Any, row_id_map: torch.Tensor,
                      prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(act_grad [rows of the forward input, hidden], prob_grad [tokens, topK] fp32)."""
    _check(input_bwd, "moe_unpermute_bwd")
    weighted = prob.numel() > 0
    top_k = prob.shape[1] if weighted else 1
    num_tokens = prob.shape[0] if weighted else row_id_map.shape[0]
    rows = row_id_map.to(torch.int64).reshape(top_k, num_tokens)
    act_grad = torch.zeros(input_fwd.shape[0], input_bwd.shape[1], dtype=input_bwd.dtype, device=EMULATED)
    prob_grad = torch.zeros(num_tokens, top_k, dtype=torch.float32, device=EMULATED)
    for k in range(top_k):
        kept = rows[k] != -1
        dest = rows[k][kept]
        grad = input_bwd[kept]
        act_grad[dest] = grad * prob[kept, k:k + 1].to(grad.dtype) if weighted else grad
        if weighted:
            prob_grad[kept, k] = lane_sum((grad * input_fwd[dest]).float(), _per_load(grad))
    return act_grad, prob_grad


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    return {"moe_permute_fwd": moe_permute_fwd, "moe_permute_bwd": moe_permute_bwd,
            "moe_unpermute_fwd": moe_unpermute_fwd, "moe_unpermute_bwd": moe_unpermute_bwd}
