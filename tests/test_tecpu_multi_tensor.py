"""tex's multi-tensor utility kernels, written from common/multi_tensor/{scale,l2norm,compute_scale}.cu with Python
loops and numpy float32 scalars, not from the emulation's vectorised code: scale in fp32 and the flag from the
inputs; l2norm's thread, block and launch order (multi_tensor_apply's 320-block / 110-tensor launches); the scales
of compute_scale. TE's own test_multi_tensor.py passes over them (docs/te-lane.md)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from te_verify.te.tecpu.multi_tensor import (launch_slots, multi_tensor_compute_scale_and_scale_inv,
                                             multi_tensor_compute_scale_inv_e8m0, multi_tensor_l2norm,
                                             multi_tensor_scale, multi_tensor_unscale_l2norm)

f32 = np.float32


def test_scale_multiplies_in_fp32_and_flags_only_non_finite_inputs():
    src = [torch.tensor([1.0, 3.0, 1e-3], dtype=torch.bfloat16), torch.tensor([2.0, 5.0])]
    dst = [torch.empty(3, dtype=torch.float16), torch.empty(2, dtype=torch.bfloat16)]
    flag = torch.zeros(1, dtype=torch.int32)
    multi_tensor_scale(2048, flag, [src, dst], 0.1)
    for s, d in zip(src, dst):
        expected = [float(f32(f32(v) * f32(0.1))) for v in s.float().tolist()]
        assert d.tolist() == torch.tensor(expected).to(d.dtype).tolist()
    assert flag.item() == 0
    multi_tensor_scale(2048, flag, [[torch.tensor([60000.0])], [torch.empty(1, dtype=torch.float16)]], 2.0)
    assert flag.item() == 0  # an output overflowing to inf is not flagged: the kernel reads its inputs
    multi_tensor_scale(2048, flag, [[torch.tensor([1.0, float("nan")])], [torch.empty(2)]], 2.0)
    assert flag.item() == 1


def test_compute_scale_and_scale_inv_elementwise():
    amax = torch.tensor([0.0, float("inf"), 1e-30, 3.0, 448.0, 500.0])
    scale, scale_inv = torch.empty(6), torch.empty(6)
    multi_tensor_compute_scale_and_scale_inv(2048, torch.zeros(1, dtype=torch.int32), [[amax], [scale], [scale_inv]],
                                             448.0, False, 1e-12)
    big = float(f32(448.0) / f32(1e-12))  # amax below epsilon (0 too) is floored to it
    assert scale.tolist() == [big, 1.0, big, float(f32(448.0) / f32(3.0)), 1.0, float(f32(448.0) / f32(500.0))]
    assert scale_inv.tolist() == [float(f32(1) / f32(s)) for s in scale.tolist()]
    multi_tensor_compute_scale_and_scale_inv(2048, torch.zeros(1, dtype=torch.int32), [[amax], [scale], [scale_inv]],
                                             448.0, True, 0.0)
    assert scale.tolist()[3:] == [128.0, 1.0, 0.5]  # powers of two at or below 448 / amax


def test_compute_scale_inv_e8m0_rounds_amax_over_448_up_to_a_power_of_two():
    amax = torch.tensor([448.0, 480.0, 0.0, 1.0], dtype=torch.bfloat16)
    out = torch.empty(4, dtype=torch.uint8)
    multi_tensor_compute_scale_inv_e8m0(2048, None, [[amax], [out]])
    assert out.tolist() == [127, 128, 0, 127 - 8]  # 1/448 rounds up to 2^-8
    with pytest.raises(RuntimeError, match="No-op flag"):
        multi_tensor_compute_scale_inv_e8m0(2048, torch.zeros(1), [[amax], [out]])


def test_launch_slots_start_over_at_320_blocks_and_110_tensors():
    assert launch_slots([700]) == list(range(320)) * 2 + list(range(60))
    assert launch_slots([1] * 115) == list(range(110)) + list(range(5))
    assert launch_slots([300, 30]) == list(range(320)) + list(range(10))


def _block_reduce(vals: list) -> np.float32:
    x = list(vals) + [f32(0)] * (512 - len(vals))
    for i in (256, 128, 64):
        for t in range(i):
            x[t] = f32(x[t] + x[t + i])
    lanes = [f32(x[t] + x[t + 32]) for t in range(32)]
    for i in (16, 8, 4, 2, 1):
        lanes = [f32(lanes[t] + lanes[t + i]) if t + i < 32 else lanes[t] for t in range(32)]
    return lanes[0]


def _chunk_result(x: list, chunk_size: int, aligned: bool) -> np.float32:
    vals = [[f32(0)] * 4 for _ in range(512)]
    n = len(x)
    for t in range(512):
        if aligned:
            i_start = t
            while i_start * 4 < n and i_start * 4 < chunk_size:
                for ii in range(4):
                    v = f32(x[i_start * 4 + ii])
                    vals[t][ii] = f32(vals[t][ii] + f32(v * v))
                i_start += 512
        else:
            for i_start in range(0, min(n, chunk_size), 2048):
                for ii in range(4):
                    i = i_start + t + ii * 512
                    if i < n and i < chunk_size:
                        v = f32(x[i])
                        vals[t][ii] = f32(vals[t][ii] + f32(v * v))
    thread = [f32(f32(f32(f32(f32(0) + v[0]) + v[1]) + v[2]) + v[3]) for v in vals]
    return _block_reduce(thread)


def _l2norm_reference(tensors: list[torch.Tensor], chunk_size: int) -> tuple[np.float32, list[np.float32]]:
    results, per_tensor = [], []
    for x in tensors:
        flat = x.float().tolist()
        aligned = len(flat) % 4 == 0 and chunk_size % 4 == 0
        mine = [_chunk_result(flat[c:], chunk_size, aligned) for c in range(0, len(flat), chunk_size)]
        results += mine
        per_tensor.append(np.sqrt(_block_reduce(mine)))
    output = [f32(0)] * 320
    for slot, result in zip(launch_slots([-(-x.numel() // chunk_size) for x in tensors]), results):
        output[slot] = f32(output[slot] + result)
    return np.sqrt(_block_reduce(output)), per_tensor


@pytest.mark.parametrize("chunk_size", [1000, 333, 2048])
def test_l2norm_in_the_kernels_thread_block_and_launch_order(chunk_size):
    gen = torch.Generator().manual_seed(chunk_size)
    tensors = [torch.randn(n, generator=gen) * torch.exp(4 * torch.randn(n, generator=gen)) for n in (3000, 1, 5002)]
    tensors[1] = tensors[1].bfloat16()
    norm, per_tensor = multi_tensor_l2norm(chunk_size, torch.zeros(1, dtype=torch.int32), [tensors], True)
    total, expected = _l2norm_reference(tensors, chunk_size)
    assert norm.item() == float(total)
    assert per_tensor.tolist() == [float(v) for v in expected]


def test_l2norm_order_is_the_kernels_not_a_running_sum():
    # 4096^2 = 2^24 absorbs every 0.25 added to it one by one; the kernel's threads sum the small squares apart first.
    x = torch.tensor([4096.0] + [0.5] * 2999)
    norm, _ = multi_tensor_l2norm(1000, torch.zeros(1, dtype=torch.int32), [[x]])
    running = f32(0)
    for v in x.tolist():
        running = f32(running + f32(f32(v) * f32(v)))
    assert running == f32(2**24) and norm.item() == float(_l2norm_reference([x], 1000)[0]) > 4096.09


def test_unscale_l2norm_scales_each_element_before_squaring_and_flags_non_finite():
    x = [torch.tensor([3.0, 4.0])]
    flag = torch.zeros(1, dtype=torch.int32)
    norm, _ = multi_tensor_unscale_l2norm(2048, flag, [x], torch.tensor([0.5]))
    assert norm.item() == 2.5 and flag.item() == 0
    multi_tensor_l2norm(2048, flag, [[torch.tensor([float("inf")])]])
    assert flag.item() == 1


def test_empty_tensors_are_refused_as_multi_tensor_apply_refuses_them():
    with pytest.raises(RuntimeError, match="zero-sized tensors"):
        multi_tensor_l2norm(2048, torch.zeros(1, dtype=torch.int32), [[torch.empty(0)]])
