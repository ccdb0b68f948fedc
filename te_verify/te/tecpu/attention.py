"""What TE's DotProductAttention reaches in tex on the emulated device: the fused-attention backend query (answered
"no fused backend") and the fused softmax kernels of its unfused path, as common/fused_softmax/*.cu and
csrc/extensions/softmax.cpp compute them, main d0067d0.

cuDNN's fused attention has no CPU counterpart, so `get_fused_attn_backend` answers NVTE_No_Backend, as a GPU whose
cuDNN supports no fused kernel for the configuration does; TE then picks FlashAttention (not installed here) or
UnfusedDotProductAttention, whose FusedScaleMaskSoftmax calls the kernels below for FP16/BF16 scores.

The kernels (one warp per row): the scores in fp32 times `scale`, the forward's scale first rounded to the input's
dtype (the dispatchers take `const input_t scale`; the backward's is fp32); masked scores are -10000 (a padding or
arbitrary mask, and the aligned causal kernel's positions past the diagonal) or -inf (the upper-triangular kernel's);
the row's max subtracted, expf, divided by the row sum, cast to the input dtype; a row whose every score is masked
gives 0 (the masked kernel's scale_value, the causal kernels' zero stores). The backward: (scale * (g y - y sum(g y)))
in fp32, cast. Sums are torch's fp32 sums, not the warp's butterfly order, and exp is torch's, not CUDA's expf: equal
to the kernels' results within the output dtype's rounding, not bit for bit.
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te.tecpu.activation import fp32
from te_verify.te.tecpu.strict import refuse

HALF = (torch.float16, torch.bfloat16)
MASKED = -10000.0  # the kernels' score for a masked position (-inf in the upper-triangular kernel)
MAX_KEYS = 16384


def get_fused_attn_backend(*args: Any, **kwargs: Any) -> tuple[Any, str]:
    """tex.get_fused_attn_backend(FusedAttentionParams) -> (NVTE_Fused_Attn_Backend.NVTE_No_Backend, reason), TE
    >= 2.20's call; an older TE's positional call is refused (its convention is not emulated)."""
    params = args[0] if len(args) == 1 and not kwargs else None
    if params is None or not hasattr(params, "qkv_layout"):
        refuse("tex.get_fused_attn_backend with TE < 2.20's arguments")
    import transformer_engine_torch as tex  # the emulated module itself: its enum carries the version's values
    return tex.NVTE_Fused_Attn_Backend.NVTE_No_Backend, "the emulated CPU device has no fused attention kernel"


def _check(t: torch.Tensor, dims: int, what: str) -> None:
    if t.dim() != dims:
        raise RuntimeError(f"{what}: expected {dims}D tensor, got {t.dim()}D")
    if t.dtype not in HALF:
        raise RuntimeError(f"{what}: Only fp16 and bf16 are supported, got {t.dtype}")


def _check_keys(keys: int, queries: int, min_queries: int = 2) -> None:
    if keys > MAX_KEYS:
        raise RuntimeError("Key sequence length must be 16384 or less")
    if keys % 8:
        raise RuntimeError("Key sequence length must be divisible by 8")
    if queries < min_queries:
        raise RuntimeError("Query sequence length must be greater than 1" if min_queries == 2 else
                           "Query sequence length must be greater or equal to 1")


def _forward_scale(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The forward dispatchers' `const input_t scale`: pybind's float rounded to the input dtype, then fp32."""
    return fp32(scale).to(x.dtype).float()


def _softmax(scores: torch.Tensor, masked: torch.Tensor | None, fill: float, dtype: torch.dtype) -> torch.Tensor:
    """Row softmax of fp32 `scores` with `masked` positions set to `fill`. With fill -10000, a row whose max is
    -10000 (every position masked) gives 0, as the masked kernel's scale_value makes it."""
    if masked is not None:
        scores = scores.masked_fill(masked, fill)
    row_max = scores.amax(-1, keepdim=True)
    exps = torch.exp(scores - row_max)
    probs = exps / exps.sum(-1, keepdim=True)
    if masked is not None and fill == MASKED:
        probs = probs.masked_fill(row_max == MASKED, 0.0)
    return probs.to(dtype)


def _backward(output_grads: torch.Tensor, softmax_results: torch.Tensor, scale: float, dims: int) -> torch.Tensor:
    _check(output_grads, dims, "output_grads")
    _check(softmax_results, dims, "softmax_results")
    y, gy = softmax_results.float(), output_grads.float() * softmax_results.float()
    return (fp32(scale) * (gy - y * gy.sum(-1, keepdim=True))).to(output_grads.dtype)


def scaled_softmax_forward(input: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """softmax(scale x) over the keys of a [b, h, sq, sk] FP16/BF16 score tensor."""
    _check(input, 4, "input")
    _check_keys(input.shape[3], input.shape[2])
    return _softmax(input.float() * _forward_scale(input, scale_factor), None, MASKED, input.dtype)


def scaled_softmax_backward(output_grad_: torch.Tensor, softmax_results_: torch.Tensor,
                            scale_factor: float) -> torch.Tensor:
    return _backward(output_grad_, softmax_results_, scale_factor, 4)


def scaled_masked_softmax_forward(input: torch.Tensor, mask: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """As scaled_softmax_forward where `mask` (uint8/bool [1 or b, 1, sq, sk]) is not 1; a position where it is 1
    scores -10000."""
    _check(input, 4, "input")
    if mask.dim() != 4:
        raise RuntimeError(f"mask: expected 4D tensor, got {mask.dim()}D")
    b, _, sq, sk = input.shape
    _check_keys(sk, sq)
    if mask.shape[0] not in (1, b) or tuple(mask.shape[1:]) != (1, sq, sk):
        raise RuntimeError(f"mask of shape {list(mask.shape)} for scores {list(input.shape)}: expected "
                           f"[1 or {b}, 1, {sq}, {sk}]")
    masked = (mask.to(torch.uint8) == 1).expand(input.shape)
    return _softmax(input.float() * _forward_scale(input, scale_factor), masked, MASKED, input.dtype)


def scaled_masked_softmax_backward(output_grad_: torch.Tensor, softmax_results_: torch.Tensor,
                                   scale_factor: float) -> torch.Tensor:
    return _backward(output_grad_, softmax_results_, scale_factor, 4)


def scaled_upper_triang_masked_softmax_forward(input: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """Causal softmax of [b h, s, s] scores: row i keeps keys 0..i, the rest -inf and 0 in the output."""
    _check(input, 3, "input")
    if input.shape[1] > MAX_KEYS:
        raise RuntimeError("Sequence length must be 16384 or less")
    rows, cols = input.shape[1:]
    above = torch.ones(rows, cols, dtype=torch.bool).triu(1).expand(input.shape)
    return _softmax(input.float() * _forward_scale(input, scale_factor), above, float("-inf"), input.dtype)


def scaled_upper_triang_masked_softmax_backward(output_grads_: torch.Tensor, softmax_results_: torch.Tensor,
                                                scale_factor: float) -> torch.Tensor:
    if output_grads_.dim() == 3 and output_grads_.shape[1] != output_grads_.shape[2]:
        raise RuntimeError(f"output_grads of shape {list(output_grads_.shape)}: expected [b h, s, s]")
    return _backward(output_grads_, softmax_results_, scale_factor, 3)


def scaled_aligned_causal_masked_softmax_forward(input: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """Causal softmax aligned to the bottom-right corner of [b, h, sq, sk] scores: row i keeps keys
    0..i + sk - sq; the rest score -10000 and are 0 in the output (a row with none kept is all 0)."""
    _check(input, 4, "input")
    rows, cols = input.shape[2:]
    _check_keys(cols, rows, min_queries=1)
    past = torch.ones(rows, cols, dtype=torch.bool).triu(cols - rows + 1).expand(input.shape)
    probs = _softmax(input.float() * _forward_scale(input, scale_factor), past, MASKED, input.dtype)
    return probs.masked_fill(past, 0.0)


def scaled_aligned_causal_masked_softmax_backward(output_grad_: torch.Tensor, softmax_results_: torch.Tensor,
                                                  scale_factor: float) -> torch.Tensor:
    return _backward(output_grad_, softmax_results_, scale_factor, 4)


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    names = ("get_fused_attn_backend", "scaled_softmax_forward", "scaled_softmax_backward",
             "scaled_masked_softmax_forward", "scaled_masked_softmax_backward",
             "scaled_upper_triang_masked_softmax_forward", "scaled_upper_triang_masked_softmax_backward",
             "scaled_aligned_causal_masked_softmax_forward", "scaled_aligned_causal_masked_softmax_backward")
    return {name: globals()[name] for name in names}
