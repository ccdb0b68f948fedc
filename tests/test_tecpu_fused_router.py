"""The fused MoE router's tex kernels (te/tecpu/fused_router.py, router_aux_loss.py, router_scores.py), against the
kernels' definitions written here per token with Python loops and numpy float32 scalars, not from the emulation: 32
lanes striding over the experts, the naive top-k's per-lane scan and shuffle, the radix top-k's 4-bit passes, the
lanes' online softmax and butterfly merge, `acc += a * b` rounded once (exact rationals), the aux loss's blocks.
Compared bitwise (expf and log1pf are the correctly rounded ones on both sides). Scores are drawn on a coarse grid so
that equal scores decide selections. Planted faults (the naive top-k breaking ties by index as torch.topk does; the
normalization summed in index order) are caught. Then TE's router.py over the emulation against plain PyTorch."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from packaging.version import Version

from te_verify.te import tecpu
from te_verify.te.tecpu import fused_router, reduction_order, router_aux_loss, router_scores
from te_verify.te.tecpu.strict import Unemulated

F = np.float32
INF = F(np.inf)


def exp(x):
    return F(math.exp(float(x))) if x < 88 else INF


def sigmoid(x):
    return F(F(1) / F(F(1) + exp(-x)))


def sqrtsoftplus(x):
    return F(np.sqrt(x if x > 20 else F(math.log1p(float(exp(x))))))


def fma(a, b, c):
    """a * b + c rounded once to fp32 (nearest, ties to even)."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    f = F(float(exact))
    near = [np.nextafter(f, -INF), f, np.nextafter(f, INF)]
    return min(near, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.array(v).view(np.int32)) & 1))


def butterfly(lanes):
    for m in (16, 8, 4, 2, 1):
        lanes = [F(lanes[i] + lanes[i ^ m]) for i in range(32)]
    return lanes[0]


def warp_sum(values, routed=None, times=None):
    lanes = [F(0)] * 32
    for i, v in enumerate(values):
        if routed is None or routed[i]:
            lanes[i % 32] = fma(v, times[i], lanes[i % 32]) if times is not None else F(lanes[i % 32] + v)
    return butterfly(lanes)


def softmax(row):
    top, total = [-INF] * 32, [F(0)] * 32
    for i, v in enumerate(row):
        lane = i % 32
        if v > top[lane]:
            total[lane], top[lane] = F(total[lane] * exp(F(top[lane] - v))), v
        total[lane] = F(total[lane] + exp(F(v - top[lane])))
    for m in (16, 8, 4, 2, 1):
        merged = [max(top[i], top[i ^ m]) for i in range(32)]
        scale = [[exp(F(t - merged[i])) if t > -INF else F(0) for t in (top[i], top[i ^ m])] for i in range(32)]
        total = [F(F(total[i] * scale[i][0]) + F(total[i ^ m] * scale[i][1])) for i in range(32)]
        top = merged
    return [F(exp(F(v - top[i % 32])) * F(F(1) / total[i % 32])) for i, v in enumerate(row)]


def naive_topk(scores, k):
    chosen = []
    for _ in range(k):
        vals, idx = [-INF] * 32, [lane if lane < len(scores) else -1 for lane in range(32)]
        for lane in range(32):
            for i in range(lane, len(scores), 32):
                if i not in chosen and scores[i] > vals[lane]:
                    vals[lane], idx[lane] = scores[i], i
        for m in (16, 8, 4, 2, 1):
            take = [vals[i ^ m] > vals[i] for i in range(32)]
            vals = [vals[i ^ m] if take[i] else vals[i] for i in range(32)]
            idx = [idx[i ^ m] if take[i] else idx[i] for i in range(32)]
        chosen.append(idx[0])
    return chosen


def radix_topk(scores, k):
    bits = [int(np.array(s, dtype=F).view(np.uint32)) for s in scores]
    u = [b ^ (0xFFFFFFFF if b >> 31 else 0x80000000) for b in bits]
    desired = mask = 0
    remaining = k
    for shift in range(28, -4, -4):
        counts = [0] * 16
        for x in u:
            if x & mask == desired:
                counts[(x >> shift) & 15] += 1
        target = 0
        for b in range(15, -1, -1):
            if counts[b] < remaining:
                remaining -= counts[b]
            else:
                target = b
                break
        desired, mask = desired | target << shift, mask | 15 << shift
    return ([i for i, x in enumerate(u) if x > desired] + [i for i, x in enumerate(u) if x == desired][:remaining])[:k]


def topk(scores, k, radix):
    return radix_topk(scores, k) if radix else naive_topk(scores, k)


def route_token(x, k, sf, pre, groups, group_topk, factor, bias, radix, qb=False):
    """One token of the forward kernel: (probs, experts in order, intermediate, cutoff)."""
    n = len(x)
    if sf == "softmax":
        scores = softmax(x) if pre else list(x)
        inter = list(scores) if pre else [-INF] * n
    elif sf == "sigmoid":
        scores = [sigmoid(v) for v in x]
        inter = list(scores)
    else:
        inter, scores = list(x), [sqrtsoftplus(v) for v in x]
    if bias is not None:
        scores = [F(s + b) for s, b in zip(scores, bias)]
    if group_topk:
        size, best = n // groups, []
        for g in range(groups):
            part = scores[g * size:(g + 1) * size]
            total = F(0)
            for i in topk(part, k // group_topk, radix):
                total = F(total + part[i])
            best.append(total)
        kept = topk(best, group_topk, radix)
        experts = topk([s if i // size in kept else -INF for i, s in enumerate(scores)], k, radix)
    else:
        experts = topk(scores, k + qb, radix)
    chosen = [scores[e] for e in experts]
    cutoff = None
    if qb:
        pos = 0
        for i in range(1, k + 1):
            if chosen[i] < chosen[pos] or (chosen[i] == chosen[pos] and experts[i] > experts[pos]):
                pos = i
        cutoff = chosen[pos]
        del chosen[pos], experts[pos]
    if bias is not None:
        chosen = [F(c - bias[e]) for c, e in zip(chosen, experts)]
    if sf == "softmax" and not pre:
        chosen = softmax(chosen)
        for c, e in zip(chosen, experts):
            inter[e] = c
    if sf != "softmax" and k > 1:
        total = F(warp_sum(chosen) + F(1e-20))
        chosen = [F(c / total) for c in chosen]
    probs = [F(0)] * n
    for c, e in zip(chosen, experts):
        probs[e] = F(F(factor) * c)
    return probs, experts, inter, cutoff


def backward_token(act, grad, routed, k, sf, pre, factor, experts=None):
    """One token of the routing-map backward kernel (sums over the experts in order, skipping the unrouted ones but
    for the pre-softmax's), or, given `experts`, of the selected-indices kernel (sums over the k indices in order)."""
    n, eps = len(act), F(1e-20)
    g = [F(v * F(factor)) for v in grad]
    if experts is not None:
        routed = [e in experts for e in range(n)]
    value = [sqrtsoftplus(a) if sf == "sqrtsoftplus" else a for a in act]

    def total(values, times=None):
        if experts is not None:
            return warp_sum([values[e] for e in experts], times=times and [times[e] for e in experts])
        return warp_sum(values, routed, times)

    if sf != "softmax" and k > 1:
        d, s_ga = F(total(value) + eps), total(g, value)
        g = [F(F(v / d) - F(s_ga / F(d * d))) if routed[e] else F(0) for e, v in enumerate(g)]
    if sf == "softmax" and pre and experts is None:
        g = [v if routed[e] else F(0) for e, v in enumerate(g)]
        dot = warp_sum(g, times=act)
        return [F(a * F(g[e] - dot)) for e, a in enumerate(act)]
    if sf == "softmax":
        dot = total(g, act)
        if pre:  # the selected-indices kernel: every expert act * (0 - dot), then the selected ones
            return [F(a * F((g[e] if routed[e] else F(0)) - dot)) for e, a in enumerate(act)]
        return [F(a * F(g[e] - dot)) if routed[e] else F(0) for e, a in enumerate(act)]
    g = [v if routed[e] else F(0) for e, v in enumerate(g)]
    if sf == "sigmoid":
        return [F(F(v * a) * F(F(1) - a)) for v, a in zip(g, act)]
    dy = [F(1) / F(F(2) * y + eps) if a > 20 else F(sigmoid(a) / F(F(2) * y + eps)) for a, y in zip(act, value)]
    return [F(v * d) for v, d in zip(g, dy)]


def grid_logits(tokens, experts, seed):
    """Logits on a grid of quarters: many equal scores per token."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-12, 12, (tokens, experts), generator=gen).float() / 4


def rows(t):
    return [[F(v) for v in row] for row in t.float().tolist()]


def assert_bitwise(got, expected, what):
    got = np.asarray(got, dtype=F)
    expected = np.asarray(expected, dtype=F)
    assert np.array_equal(got.view(np.int32), expected.view(np.int32)) or np.array_equal(got, expected), what


@pytest.fixture
def radix_threshold(monkeypatch):
    """Set NVTE_RADIX_TOPK_THRESHOLD for one test (TE reads it once per kernel file: the cache is cleared)."""
    def set_threshold(value: int):
        monkeypatch.setenv("NVTE_RADIX_TOPK_THRESHOLD", str(value))
        router_scores.radix_threshold.cache_clear()
    yield set_threshold
    router_scores.radix_threshold.cache_clear()


CASES = [  # score function, pre-softmax, topk, groups, group_topk, expert bias, radix
    ("softmax", True, 4, None, None, False, False), ("softmax", False, 5, None, None, False, True),
    ("softmax", False, 4, 8, 2, False, False), ("sigmoid", False, 4, None, None, True, False),
    ("sigmoid", False, 6, 8, 3, True, True), ("sqrtsoftplus", False, 9, None, None, True, False),
    ("sqrtsoftplus", False, 4, 8, 2, False, True), ("sigmoid", False, 1, None, None, False, False),
    ("sigmoid", False, 8, 8, 2, True, True)]


@pytest.mark.parametrize("sf,pre,k,groups,group_topk,with_bias,radix", CASES)
@pytest.mark.parametrize("output", ["bytemap", "bitmap", "dense"])
def test_topk_forward_and_backward_follow_the_kernels(radix_threshold, sf, pre, k, groups, group_topk, with_bias,
                                                      radix, output):
    radix_threshold(2 if radix else 16)
    tokens, experts = 4, 72
    logits = grid_logits(tokens, experts, seed=k)
    bias = (torch.arange(experts) % 5 * 0.125 - 0.25) if with_bias else None
    indices = torch.empty(tokens, k, dtype=torch.int16) if output == "dense" else None
    fmt = 1 if output == "bitmap" else 0
    probs, routing, inter = fused_router.fused_topk_with_score_function_fwd(
        logits, k, pre, groups, group_topk, 1.5, sf, bias, fmt, indices)
    grad = grid_logits(tokens, experts, seed=99) * 3
    grad_logits = torch.empty_like(grad)
    fused_router.fused_topk_with_score_function_bwd(routing, inter, grad, grad_logits, k, pre, 1.5, sf,
                                                    output == "dense", fmt)
    bias_list = [F(b) for b in bias.tolist()] if bias is not None else None
    for t, x in enumerate(rows(logits)):
        p, chosen, i, _ = route_token(x, k, sf, pre, groups or 0, group_topk or 0, 1.5, bias_list, radix)
        assert_bitwise(probs[t].numpy(), p, f"probs of token {t}")
        assert_bitwise(inter[t].numpy(), i, f"intermediate_output of token {t}")
        routed = [e in chosen for e in range(experts)]
        if output == "dense":
            assert routing[t].tolist() == chosen, f"token {t}: the kernel's selection order"
        elif output == "bitmap":
            assert routing.dtype == torch.uint8 and routing.shape == (tokens, 9)
            assert routing[t].tolist() == [sum(routed[8 * b + j] << j for j in range(8)) for b in range(9)]
        else:
            assert routing.dtype == torch.bool and routing[t].tolist() == routed
        expected = backward_token(i, rows(grad)[t], routed, k, sf, pre, 1.5, chosen if output == "dense" else None)
        assert_bitwise(grad_logits[t].numpy(), expected, f"grad_logits of token {t}")


def test_naive_ties_go_to_the_bit_reversed_lane_then_the_earlier_element():
    scores = torch.zeros(1, 72)  # all equal: lanes 0, 16, 8, 24, 4, ... in that order, each with its first element
    experts, _ = router_scores.select(scores, 6, False, "test")
    assert experts[0].tolist() == naive_topk([F(0)] * 72, 6) == [0, 32, 64, 16, 48, 8]
    radix, _ = router_scores.select(scores, 6, True, "test")
    assert radix[0].tolist() == [0, 1, 2, 3, 4, 5]
    signed = torch.tensor([[-0.0, 0.0, -1.0]])  # equal for the naive selection; -0 below +0 for the radix one
    assert router_scores.select(signed, 1, False, "test")[0].tolist() == [[0]] == [naive_topk(rows(signed)[0], 1)]
    assert router_scores.select(signed, 1, True, "test")[0].tolist() == [[1]] == [radix_topk(rows(signed)[0], 1)]


def test_group_scores_sum_in_selection_order():
    """Group 0's top 3 (1, 2^-24, 2^-24) sum to 1 in the naive selection's order, to 1 + 2^-23 from the small end;
    group 1's to 1 + 2^-23: the order decides which group routes."""
    logits = torch.full((1, 16), -10.0)
    logits[0, :3] = torch.tensor([1.0, 2.0**-24, 2.0**-24])
    logits[0, 4:7] = torch.tensor([1.0 + 2.0**-23, 0.0, 0.0])
    _, routing, _ = fused_router.fused_topk_with_score_function_fwd(logits, 3, False, 4, 1, None, "softmax", None)
    assert routing[0].nonzero().squeeze(1).tolist() == [4, 5, 6]
    assert route_token(rows(logits)[0], 3, "softmax", False, 4, 1, 1.0, None, False)[1] == [4, 6, 5]  # lane 6 first


def test_planted_tie_order_of_torch_topk_is_caught(monkeypatch):
    monkeypatch.setattr(router_scores, "naive_tie_rank", lambda n: torch.arange(n))  # equal scores by index
    logits = grid_logits(4, 72, seed=4)
    _, routing, _ = fused_router.fused_topk_with_score_function_fwd(logits, 4, True, None, None, None, "softmax",
                                                                    None, 0, torch.empty(4, 4, dtype=torch.int64))
    expected = [route_token(x, 4, "softmax", True, 0, 0, 1.0, None, False)[1] for x in rows(logits)]
    assert routing.tolist() != expected


def test_planted_index_order_normalization_is_caught(monkeypatch, radix_threshold):
    radix_threshold(16)
    logits = torch.randn(8, 72, generator=torch.Generator().manual_seed(3)) * 4
    args = (logits, 16, False, None, None, None, "sigmoid", None)
    probs = fused_router.fused_topk_with_score_function_fwd(*args)[0]
    expected = [route_token(x, 16, "sigmoid", False, 0, 0, 1.0, None, True)[0] for x in rows(logits)]
    assert_bitwise(probs.numpy(), expected, "probs")
    monkeypatch.setattr(fused_router, "warp_sum", lambda x, *a, **k: x.sum(-1))
    planted = fused_router.fused_topk_with_score_function_fwd(*args)[0]
    assert not np.array_equal(planted.numpy(), np.asarray(expected, dtype=F))


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("radix", [False, True])
def test_qb_cutoff_and_histogram(radix_threshold, mode, radix):
    radix_threshold(2 if radix else 16)
    gen = torch.Generator().manual_seed(5)
    logits, k, bins = torch.randint(-2, 3, (6, 40), generator=gen).float() / 2, 4, 16  # equal scores at the cutoff
    bias = torch.arange(40) % 3 * 0.25
    histogram = torch.ones(40, bins, dtype=torch.int32)
    bounds = torch.tensor([-0.75, 0.5])
    probs, routing, inter, cutoff, out = fused_router.fused_topk_with_score_function_qb_fwd(
        logits, k, 1.25, bias, 0, None, histogram, bounds, mode)
    expected = np.ones((40, bins), dtype=np.int64)
    scale = F(F(bins) / F(F(0.5) - F(-0.75)))
    for t, x in enumerate(rows(logits)):
        p, chosen, i, cut = route_token(x, k, "sigmoid", False, 0, 0, 1.25, [F(b) for b in bias.tolist()], radix, True)
        assert_bitwise(probs[t].numpy(), p, f"probs of token {t}")
        assert routing[t].tolist() == [e in chosen for e in range(40)] and cutoff[t].item() == cut
        for e in range(40):
            expected[e, min(max(math.floor(F(F(F(cut - i[e]) - F(-0.75)) * scale)), 0), bins - 1)] += 1
    assert out is histogram and histogram.tolist() == expected.tolist()
    with pytest.raises(RuntimeError, match="finite with lower < upper"):
        fused_router.fused_topk_with_score_function_qb_fwd(logits, k, None, bias, 0, None, histogram,
                                                          torch.tensor([1.0, 1.0]), mode)


@pytest.mark.parametrize("sf", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("radix", [False, True])
def test_scores_for_aux_loss(radix_threshold, sf, radix):
    radix_threshold(2 if radix else 16)
    logits, grad = grid_logits(3, 70, seed=7), grid_logits(3, 70, seed=8)
    scores, routing, inter = router_aux_loss.fused_score_for_moe_aux_loss_fwd(logits, 5, sf, 1)
    grad_logits = torch.empty(3, 70, dtype=torch.bfloat16)
    router_aux_loss.fused_score_for_moe_aux_loss_bwd(inter, grad, grad_logits, 5, sf)
    for t, x in enumerate(rows(logits)):
        act = [sigmoid(v) if sf == "sigmoid" else sqrtsoftplus(v) for v in x] if sf != "softmax" else softmax(x)
        s = act if sf == "softmax" else [F(a / F(warp_sum(act) + F(1e-20))) for a in act]
        assert_bitwise(scores[t].numpy(), s, f"scores of token {t}")
        chosen = topk(s, 5, radix)
        assert routing[t].tolist() == [sum((8 * b + j in chosen) << j for j in range(8) if 8 * b + j < 70)
                                       for b in range(9)]
        a = x if sf == "sqrtsoftplus" else act
        g = rows(grad)[t]
        expected = backward_token(a, g, [True] * 70, 2, sf, True, 1.0)
        assert_bitwise(grad_logits[t].float().numpy(), torch.tensor(expected).bfloat16().float().numpy(), f"{t}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_aux_loss_sums_per_block_then_in_block_order(dtype):
    rows_, cols, experts, topk_, coeff = 300, 40, 20, 3, 0.01
    probs = (torch.rand(rows_, cols, generator=torch.Generator().manual_seed(1)) * 2 ** torch.arange(cols) % 7)
    probs = probs.to(dtype)
    tokens = torch.randint(1, 1000, (cols,), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    loss, const = router_aux_loss.fused_moe_aux_loss_fwd(probs, tokens, 1234, experts, rows_, cols, topk_, coeff)
    c = F(F(F(F(F(experts) * F(coeff)) / F(topk_)) / F(1234)) / F(1234))
    p, blocks, total = rows(probs), 2 * 132, F(0)
    for b in range(blocks):
        threads = [F(0)] * 64
        for col in range(cols):
            col_sum = F(0)
            for r in range(b, rows_, blocks):
                col_sum = F(col_sum + p[r][col])
            threads[col] = F(threads[col] + F(col_sum * F(tokens[col].item())))
        lanes = [F(threads[lane] + threads[lane + 32]) for lane in range(32)]
        total = F(total + F(butterfly(lanes) * c))
    assert const.tolist() == [c, total] and loss.dtype == dtype and loss.item() == torch.tensor(total).to(dtype).item()
    graph_safe = router_aux_loss.fused_moe_aux_loss_fwd_graph_safe(probs, tokens, torch.tensor(1234), experts, rows_,
                                                                   cols, topk_, coeff)
    assert torch.equal(graph_safe[1], const)
    grad = router_aux_loss.fused_moe_aux_loss_bwd(const, tokens, rows_, cols, torch.tensor(2.5, dtype=dtype))
    expected = [F(F(c * F(n)) * F(torch.tensor(2.5, dtype=dtype).item())) for n in tokens.tolist()]
    assert grad.dtype == dtype and torch.equal(grad, torch.tensor([expected] * rows_).to(dtype))


def test_fma_rounds_once():
    a = torch.tensor([1 + 3 * 2.0**-12] * 3)  # a * a is an fp32 tie plus 0 or 2^-80 either side, after fp64 rounding
    c = torch.tensor([2.0**-80, -(2.0**-80), 0.0])
    assert [(v - 1) * 2**23 for v in reduction_order.fma(a, a, c).double().tolist()] == [12293, 12292, 12292]
    assert all(F(reduction_order.fma(a, a, c)[i].item()) == fma(F(a[i]), F(a[i]), F(c[i])) for i in range(3))


def test_refusals(monkeypatch):
    with pytest.raises(Unemulated, match="NaN router scores"):
        fused_router.fused_topk_with_score_function_fwd(torch.full((2, 8), float("nan")), 2, False, None, None,
                                                        None, "sigmoid", None)
    with pytest.raises(Unemulated, match="reaches -inf"):
        fused_router.fused_topk_with_score_function_fwd(torch.full((2, 8), float("-inf")), 2, False, None, None,
                                                        None, "softmax", None)
    monkeypatch.setattr(router_scores, "installed_te_version", lambda: Version("2.17.1"))
    with pytest.raises(Unemulated, match=r"fused_score_for_moe_aux_loss_bwd under TE 2\.17\.1"):
        router_aux_loss.functions()["fused_score_for_moe_aux_loss_bwd"](1, 2, 3, 4, 5, 6, 7)  # 2.14's arguments
    with pytest.raises(RuntimeError, match="topk must be in"):
        fused_router.fused_topk_with_score_function_fwd(torch.zeros(2, 8), 9, False, None, None, None, "softmax", None)


@pytest.fixture(scope="module")
def te_router():
    tecpu.boot()
    from transformer_engine.pytorch import router
    return router


@pytest.mark.parametrize("sf", ["softmax", "sigmoid"])
def test_te_router_against_plain_torch(te_router, sf):
    logits = torch.randn(32, 64, generator=torch.Generator().manual_seed(11)).requires_grad_()
    ref = logits.detach().clone().requires_grad_()
    bias = torch.linspace(-0.1, 0.1, 64) if sf == "sigmoid" else None
    probs, routing = te_router.fused_topk_with_score_function(logits, 4, False, None, None, 1.2, sf, bias)
    scores = torch.sigmoid(ref) if sf == "sigmoid" else ref
    experts = (scores + (bias if bias is not None else 0)).topk(4, -1).indices
    picked = scores.gather(1, experts)
    picked = picked.softmax(-1) if sf == "softmax" else picked / (picked.sum(-1, keepdim=True) + 1e-20)
    expected = torch.zeros_like(ref).scatter(1, experts, picked * 1.2)
    torch.testing.assert_close(probs, expected)
    assert torch.equal(routing, expected != 0)
    weights = torch.randn(32, 64, generator=torch.Generator().manual_seed(12))
    (probs * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(logits.grad, ref.grad)
    histogram = torch.zeros(64, 10, dtype=torch.int32)
    bounds = torch.tensor([-1.0, 1.0])
    te_router.fused_topk_with_score_function(logits, 4, False, None, None, None, "sigmoid", torch.zeros(64),
                                             qb_histogram=histogram, qb_bin_bounds=bounds,
                                             qb_histogram_mode="fused_atomic")  # validates through torch.cuda.device
    assert histogram.sum().item() == 32 * 64
