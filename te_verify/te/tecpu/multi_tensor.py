"""tex's multi-tensor utility kernels (common/multi_tensor/scale.cu, l2norm.cu, compute_scale.cu, main d0067d0):
multi_tensor_scale[_tensor], multi_tensor_l2norm, multi_tensor_unscale_l2norm, multi_tensor_compute_scale_and_scale_inv,
multi_tensor_compute_scale_inv_e8m0. Megatron-core's gradient clipping (optimizer/clip_grads.py) takes TE's l2norm
and scale when TE is installed; FP8 primary weights compute their scales with compute_scale.

Each takes (chunk_size, noop_flag, tensor_lists, ...) from TE's multi_tensor_applier:
- scale: out = in * scale in fp32, cast to out's dtype; the flag set to 1 when an input is not finite;
- compute_scale_and_scale_inv: recipe_common.cuh's compute_scale_from_amax elementwise (inf -> FLT_MAX), and its
  reciprocal; compute_scale_inv_e8m0: float_to_e8m0(bf16 amax * (1 / 448 in fp32));
- l2norm: multi_tensor_apply's launches (at most 320 blocks and 110 tensors each; a block is one chunk of one tensor)
  and the kernel's order: a chunk's 512 threads each keep 4 fp32 sums of squares (aligned: 4-element vectors
  t, t + 512, ...; otherwise elements t + 512 ii, stepping 2048), add their 4, then reduce_block_into_lanes (a tree
  over 256, 128, 64, then 32 and a shuffle-down); a block adds its result into output[its slot in the launch], launch
  after launch; `cleanup` reduces the 320 slots the same way and takes the square root; per tensor its chunks'
  results, in chunk order. The flag is set when a chunk's result is not finite.
TE builds these files with --use_fast_math (common/CMakeLists.txt): on the device `v += x * x` may be one FMA,
subnormals flush to zero, and sqrt and division are the hardware's approximations. The emulation rounds each product,
keeps subnormals and computes sqrt and division correctly rounded (sqrt through fp64: torch's CPU fp32 sqrt is not
correctly rounded for about 20% of inputs on this machine's AVX512 build): within a few fp32 ulps of the device.
Zero-element tensors are refused as multi_tensor_apply's check refuses them.
"""
from __future__ import annotations

import torch

from te_verify.te import fp8
from te_verify.te.tecpu import block_fp8, mxfp8
from te_verify.te.tecpu.device import EMULATED
from te_verify.te.tecpu.reduction_order import block_reduce, running_sum
from te_verify.te.tecpu.writes import write

F32 = torch.float32
THREADS, ILP = 512, 4
MAX_BLOCKS, MAX_TENSORS = 320, 110  # depth_to_max_blocks / depth_to_max_tensors for one list
FLOAT32_MAX = torch.finfo(F32).max


def _check(tensor_lists: list[list[torch.Tensor]], depth: int) -> None:
    if len(tensor_lists) != depth:
        raise RuntimeError("tensor_lists.size() != depth")
    if any(t.numel() == 0 for t in tensor_lists[0]):
        raise RuntimeError("multi_tensor_apply expects tensors with at least one chunk; zero-sized tensors must be "
                           "filtered before launch because they skip the chunk loop")


def _flag(noop_flag: torch.Tensor | None, raised: bool) -> None:
    if raised and noop_flag is not None:
        write(noop_flag.reshape(-1)[:1], 1)


def _scale(tensor_lists: list[list[torch.Tensor]], noop_flag: torch.Tensor, scale: torch.Tensor) -> None:
    _check(tensor_lists, 2)
    finite = True
    for src, dst in zip(*tensor_lists):
        values = src.to(F32)
        finite = finite and bool(torch.isfinite(values).all())
        write(dst, (values * scale).to(dst.dtype))
    _flag(noop_flag, not finite)


def multi_tensor_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                       scale: float) -> None:
    """Lists in, out: out = in * scale."""
    _scale(tensor_lists, noop_flag, torch.tensor(scale, dtype=F32))


def multi_tensor_scale_tensor(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                              scale: torch.Tensor) -> None:
    """Lists in, out: out = in * scale[0] (an fp32 device tensor)."""
    _scale(tensor_lists, noop_flag, scale.reshape(-1)[0].to(F32))


def multi_tensor_compute_scale_and_scale_inv(chunk_size: int, noop_flag: torch.Tensor,
                                             tensor_lists: list[list[torch.Tensor]], max_fp8: float,
                                             force_pow_2_scales: bool, epsilon: float) -> None:
    """Lists amax, scale, scale_inv (fp32)."""
    _check(tensor_lists, 3)
    for amax, scale, scale_inv in zip(*tensor_lists):
        value = block_fp8.scale_from_amax(amax, max_fp8, force_pow_2_scales, epsilon, FLOAT32_MAX)
        write(scale, value.reshape(scale.shape))
        write(scale_inv, (1 / value).reshape(scale_inv.shape))


def multi_tensor_compute_scale_inv_e8m0(chunk_size: int, noop_flag: None,
                                        tensor_lists: list[list[torch.Tensor]]) -> None:
    """Lists amax (bf16), scale_inv (uint8 E8M0): the power of two at or above amax / 448."""
    if noop_flag is not None:
        raise RuntimeError("No-op flag is not supported.")
    _check(tensor_lists, 2)
    if tensor_lists[0][0].dtype != torch.bfloat16:
        raise RuntimeError("amax should be bf16")
    for amax, scale_inv in zip(*tensor_lists):
        rcp = mxfp8.MAX_NORM_RCP[torch.float8_e4m3fn]
        write(scale_inv, mxfp8.e8m0_round_up(amax.float() * rcp).view(scale_inv.dtype).reshape(scale_inv.shape))


def _chunk_results(x: torch.Tensor, chunk_size: int, inv_scale: torch.Tensor | None) -> torch.Tensor:
    """Each chunk's reduce_block_into_lanes result for one tensor ([chunks] fp32)."""
    flat = x.reshape(-1)
    chunks = -(-flat.numel() // chunk_size)
    aligned = (flat.numel() % ILP == 0 and chunk_size % ILP == 0
               and flat.data_ptr() % (ILP * flat.element_size()) == 0)
    values = flat.to(F32)
    if inv_scale is not None:
        values = values * inv_scale
    span = -(-chunk_size // (THREADS * ILP)) * THREADS * ILP  # a chunk padded to whole 2048-element steps
    whole = torch.nn.functional.pad(values, (0, chunks * chunk_size - values.numel())).reshape(chunks, chunk_size)
    padded = torch.nn.functional.pad(whole, (0, span - chunk_size))  # zeros add nothing to a sum of squares
    steps = padded.reshape(chunks, -1, THREADS, ILP) if aligned else padded.reshape(chunks, -1, ILP, THREADS)
    if not aligned:
        steps = steps.transpose(2, 3)  # [chunks, steps, thread, ii]
    sums = running_sum(steps * steps, 1)  # [chunks, thread, ii]: each thread's ILP sums over its steps
    return block_reduce(running_sum(sums, -1))


def launch_slots(chunk_counts: list[int]) -> list[int]:
    """multi_tensor_apply's block index of every chunk (tensor by tensor, chunk by chunk) within its launch."""
    slots, slot, tensors = [], 0, 0
    for t, chunks in enumerate(chunk_counts):
        tensors += 1
        for chunk in range(chunks):
            slots.append(slot)
            slot += 1
            last = chunk == chunks - 1
            if (tensors == MAX_TENSORS and last) or slot == MAX_BLOCKS or (t == len(chunk_counts) - 1 and last):
                slot, tensors = 0, (0 if last else 1)
    return slots


def _accumulate(slots: torch.Tensor, results: torch.Tensor) -> torch.Tensor:
    """output[slot] += result, in chunk order (one block a slot per launch, launches in turn)."""
    output = torch.zeros(MAX_BLOCKS, dtype=F32, device=EMULATED)
    order = torch.argsort(slots, stable=True)
    sorted_slots = slots[order]
    first = torch.searchsorted(sorted_slots, sorted_slots)  # where each slot's run starts
    rounds = torch.empty_like(slots)
    rounds[order] = torch.arange(slots.numel(), device=EMULATED) - first
    for r in range(int(rounds.max()) + 1 if slots.numel() else 0):
        mine = rounds == r
        output[slots[mine]] = output[slots[mine]] + results[mine]
    return output


def _l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
            inv_scale: torch.Tensor | None, per_tensor: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    _check(tensor_lists, 1)
    tensors = tensor_lists[0]
    per_chunk = [_chunk_results(x, chunk_size, inv_scale) for x in tensors]
    results = torch.cat(per_chunk)
    _flag(noop_flag, not bool(torch.isfinite(results).all()))
    slots = torch.tensor(launch_slots([r.numel() for r in per_chunk]), dtype=torch.int64, device=EMULATED)
    output = _accumulate(slots, results)
    total = _sqrt(block_reduce(torch.nn.functional.pad(output, (0, THREADS - MAX_BLOCKS)))).reshape(1)
    if not per_tensor:
        return total, torch.empty(0, dtype=F32, device=EMULATED)
    return total, _sqrt(block_reduce(_strided_sums(per_chunk)))


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """IEEE sqrt of fp32 values, correctly rounded (fp64 holds more than twice fp32's precision: no double rounding)."""
    return torch.sqrt(x.double()).to(F32)


def _strided_sums(per_chunk: list[torch.Tensor]) -> torch.Tensor:
    """cleanup's per-tensor block: thread t sums its tensor's chunk results t, t + 512, ... in turn ([n, 512])."""
    width = -(-max(r.numel() for r in per_chunk) // THREADS) * THREADS
    rows = torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in per_chunk])
    return running_sum(rows.reshape(len(per_chunk), -1, THREADS), 1)


def multi_tensor_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                        per_tensor: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the lists' L2 norm [1], each tensor's [n] or empty)."""
    return _l2norm(chunk_size, noop_flag, tensor_lists, None, per_tensor)


def multi_tensor_unscale_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                                inv_scale: torch.Tensor, per_tensor: bool | None = None,
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The L2 norm of every element times inv_scale[0]."""
    return _l2norm(chunk_size, noop_flag, tensor_lists, inv_scale.reshape(-1)[0].to(F32), per_tensor)


def functions() -> dict[str, object]:
    """The emulated tex functions of this module, by name."""
    return {"multi_tensor_scale": multi_tensor_scale, "multi_tensor_scale_tensor": multi_tensor_scale_tensor,
            "multi_tensor_l2norm": multi_tensor_l2norm, "multi_tensor_unscale_l2norm": multi_tensor_unscale_l2norm,
            "multi_tensor_compute_scale_and_scale_inv": multi_tensor_compute_scale_and_scale_inv,
            "multi_tensor_compute_scale_inv_e8m0": multi_tensor_compute_scale_inv_e8m0}
