"""MoE permutation by an index router map (tex.moe_permute_fwd / moe_unpermute_fwd / moe_unpermute_bwd), written from
common/permutation/permutation.cu's definition with Python lists and numpy float32 scalars, not from the emulation:
pairs sorted stably by expert id as uint32, rows past num_out_tokens dropped; unpermute's sum in the data's dtype,
k by k; prob_grad's fp32 sum lane by lane (16-byte chunks), then a butterfly over 32 lanes. Then TE's own
te.moe_permute / te.moe_unpermute (map_type="index") forward and backward against plain PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu.moe_permute import lane_sum, moe_permute_fwd, moe_unpermute_bwd, moe_unpermute_fwd
from te_verify.te.tecpu.strict import Unemulated


def _expected_permute(indices: list[list[int]], num_out: int) -> tuple[list[int], list[int]]:
    """(the source token of each output row, row_id_map) from the definition."""
    top_k, n = len(indices[0]), len(indices)
    pairs = sorted(range(n * top_k), key=lambda r: (indices[r // top_k][r % top_k] % 2**32, r))
    row_map = [0] * (n * top_k)
    for p, r in enumerate(pairs):
        row_map[(r % top_k) * n + r // top_k] = p if p < num_out else -1
    return [r // top_k for r in pairs[:num_out]], row_map


@pytest.mark.parametrize("num_out", [0, 4])
def test_permute_sorts_pairs_by_expert_and_drops_past_num_out(num_out):
    indices = [[1, 0], [0, 2], [2, -1], [1, 1]]  # -1 (a masked expert) sorts last, as uint32
    x = torch.arange(4 * 8, dtype=torch.float32).reshape(4, 8)
    out, row_map, workspace = moe_permute_fwd(x, None, torch.tensor(indices, dtype=torch.int32), num_out, [], 8)
    sources, expected_map = _expected_permute(indices, num_out or 8)
    assert row_map.tolist() == expected_map
    assert out.shape == (num_out or 8, 8) and torch.equal(out, x[sources])
    assert len(workspace) == 4


def test_unpermute_sums_in_the_data_dtype_k_by_k():
    # bf16 k by k: 1 + 0.75 * 2^-8 rounds back to 1, twice; an fp32 sum rounded once gives 1 + 2^-7.
    row_map = torch.tensor([0, 1, 2], dtype=torch.int32)  # one token, topK 3, rows 0..2
    rows = torch.tensor([[1.0] * 8, [0.75 * 2**-8] * 8, [0.75 * 2**-8] * 8], dtype=torch.bfloat16)
    out = moe_unpermute_fwd(rows, None, row_map, torch.ones(1, 3), 1, 3)
    assert out.dtype == torch.bfloat16 and out.float().unique().tolist() == [1.0]
    assert rows.float().sum(0).bfloat16().float().unique().tolist() == [1.0 + 2**-7]


def test_unpermute_skips_dropped_rows_and_weights_by_prob_rounded_to_the_dtype():
    rows = torch.tensor([[2.0] * 8, [3.0] * 8], dtype=torch.float16)
    # row_id_map[k * tokens + t], 2 tokens, topK 2: token 0 takes rows 1 then 0; token 1 a dropped row, then row 1.
    row_map = torch.tensor([1, -1, 0, 1], dtype=torch.int32)
    prob = torch.tensor([[0.1, 0.2], [0.3, 0.4]])
    out = moe_unpermute_fwd(rows, None, row_map, prob, 2, 2)
    h = np.float16
    token0 = h(h(h(3.0) * h(0.1)) + h(h(2.0) * h(0.2)))
    token1 = h(h(3.0) * h(0.4))
    assert out[0].tolist() == [float(token0)] * 8 and out[1].tolist() == [float(token1)] * 8


def _lane_reference(row: list[float], chunk: int) -> np.float32:
    lanes = [np.float32(0)] * 32
    for start in range(0, len(row), chunk):
        lane = (start // chunk) % 32
        for value in row[start:start + chunk]:
            lanes[lane] = np.float32(lanes[lane] + np.float32(value))
    for mask in (16, 8, 4, 2, 1):
        lanes = [np.float32(lanes[i] + lanes[i ^ mask]) for i in range(32)]
    return lanes[0]


@pytest.mark.parametrize("hidden,chunk", [(64, 4), (4096, 8), (200, 8)])
def test_prob_grad_sums_lane_by_lane_then_butterflies(hidden, chunk):
    gen = torch.Generator().manual_seed(hidden)
    products = torch.randn(3, hidden, generator=gen) * torch.logspace(-4, 4, hidden)
    got = lane_sum(products, chunk)
    for t in range(3):
        assert got[t].item() == float(_lane_reference(products[t].tolist(), chunk)), t
    sequential = [float(np.sum(np.float32(products[t].numpy()), dtype=np.float32)) for t in range(3)]
    assert got.tolist() != sequential  # the order is what the check holds


def test_unpermute_bwd_scatters_weighted_grads_and_reduces_prob_grads():
    fwd = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    grad = torch.randn(2, 8, generator=torch.Generator().manual_seed(2))
    row_map = torch.tensor([2, 0, -1, 1], dtype=torch.int32)  # token 0: rows 2, -1; token 1: rows 0, 1
    prob = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    act, prob_grad = moe_unpermute_bwd(grad, fwd, None, row_map, prob)
    assert torch.equal(act[2], grad[0] * 0.25) and torch.equal(act[0], grad[1] * 0.5)
    assert torch.equal(act[1], grad[1] * 0.5)
    assert prob_grad[0, 1].item() == 0.0  # dropped
    assert prob_grad[1, 0].item() == float(_lane_reference((grad[1] * fwd[0]).tolist(), 4))


def test_fp8_data_is_refused():
    with pytest.raises(Unemulated, match="moe_unpermute_fwd over torch.float8_e4m3fn"):
        moe_unpermute_fwd(torch.zeros(2, 16).to(torch.float8_e4m3fn), None, torch.tensor([0, 1], dtype=torch.int32),
                          torch.empty(0), 2, 1)


@pytest.fixture(scope="module")
def te_pytorch():
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    return te_pytorch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_te_moe_permute_index_map_matches_plain_torch(te_pytorch, dtype):
    gen = torch.Generator().manual_seed(7)
    tokens, hidden, experts, top_k = 16, 32, 4, 2
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).requires_grad_()
    indices = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).int()
    probs = torch.softmax(torch.randn(tokens, top_k, generator=gen), -1).requires_grad_()
    kept = 24  # of 32 (token, expert) pairs: the last 8 in expert order are dropped
    permuted, row_map = te_pytorch.moe_permute(x, indices, kept, map_type="index")
    out = te_pytorch.moe_unpermute(permuted, row_map, probs, map_type="index")
    out.backward(torch.ones_like(out))

    order = torch.sort(indices.reshape(-1).long(), stable=True).indices
    x_ref, p_ref = x.detach().clone().requires_grad_(), probs.detach().clone().requires_grad_()
    permuted_ref = x_ref[order[:kept] // top_k]
    back = torch.zeros(tokens * top_k, hidden, dtype=dtype).index_copy(0, order[:kept], permuted_ref)
    out_ref = (back.reshape(tokens, top_k, hidden).float() * p_ref[..., None]).sum(1).to(dtype)
    out_ref.backward(torch.ones_like(out_ref))
    assert torch.equal(permuted, permuted_ref)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(probs.grad, p_ref.grad)
