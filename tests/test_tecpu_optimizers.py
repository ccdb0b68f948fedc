"""tex's fused optimizer kernels (te_verify/te/tecpu/optimizers.py) held to adam.cu's and sgd.cu's definitions,
written here in float64 from the kernels' fp32 inputs:
- multi_tensor_adam, L2 and AdamW modes, with and without bias correction, over three steps: parameters and moments
  within a few fp32 ulps of the definition (each of the kernel's dozen operations rounds once), the host's bias
  correction from float betas; a master copy drives a BF16 parameter, which is its cast bitwise; BF16 moments are
  stored rounded;
- the capturable forms: lr and step tensors, the gradient times inv_scale (stored back, as GradScaler's unscale_
  would), nothing changed when the noop flag is 1;
- multi_tensor_sgd: momentum, dampening, nesterov, the first run, weight decay before and after momentum, the fp16
  copy; sgd.cu's dtype combinations and adam.cu's list checks;
- TE's FusedAdam and FusedSGD over them against torch.optim's Adam, AdamW and SGD for three steps."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu
from ulps import assert_close_ulps



@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex

    return types.SimpleNamespace(te=te_pytorch, tex=tex)


def rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def adam_definition(g, p, m, v, lr, b1, b2, eps, step, mode, bias_correction, decay, inv_scale=1.0):
    """adam.cu's update in float64 from the fp32 inputs (the kernel's arguments rounded to float first)."""
    g, p, m, v = (t.double() for t in (g, p, m, v))
    lr, b1, b2, eps, decay = (f32(x) for x in (lr, b1, b2, eps, decay))
    c1, c2 = ((1 - b1 ** step), (1 - b2 ** step)) if bias_correction else (1.0, 1.0)
    g = g * inv_scale
    if mode == 0:
        g = g + decay * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    update = (m / c1) / ((v / c2).sqrt() + eps)
    if mode == 1:
        update = update + decay * p
    return p - lr * update, m, v


ADAM = dict(lr=1e-2, b1=0.9, b2=0.999, eps=1e-8, decay=0.1)


@pytest.mark.parametrize("mode", [0, 1], ids=["l2", "adamw"])
@pytest.mark.parametrize("bias_correction", [1, 0])
def test_multi_tensor_adam_is_adam_cu_over_three_steps(te, mode, bias_correction):
    shapes = [(64, 32), (17,)]
    params = [rand(*s, seed=i) for i, s in enumerate(shapes)]
    moments = [torch.zeros(s) for s in shapes], [torch.zeros(s) for s in shapes]
    for step in (1, 2, 3):
        grads = [rand(*s, seed=10 * step + i) for i, s in enumerate(shapes)]
        want = [adam_definition(g, p, m, v, ADAM["lr"], ADAM["b1"], ADAM["b2"], ADAM["eps"], step, mode,
                                bias_correction, ADAM["decay"]) for g, p, m, v in zip(grads, params, *moments)]
        before = [p.clone() for p in params]
        te.tex.multi_tensor_adam(65536, torch.zeros(1, dtype=torch.int), [grads, params, *moments], ADAM["lr"],
                                 ADAM["b1"], ADAM["b2"], ADAM["eps"], step, mode, bias_correction, ADAM["decay"])
        for j, (wp, wm, wv) in enumerate(want):
            moved = (params[j].double() - before[j].double()).abs()
            assert_close_ulps(params[j], wp, before[j].abs().double() + moved, 8, f"step {step} param {j}")
            assert_close_ulps(moments[0][j], wm, wm.abs() + grads[j].abs().double(), 8, f"step {step} exp_avg {j}")
            assert_close_ulps(moments[1][j], wv, wv.abs() + grads[j].double() ** 2, 8, f"step {step} exp_avg_sq {j}")


def test_a_master_copy_drives_a_bf16_parameter_and_bf16_moments_are_stored_rounded(te):
    master = rand(128, seed=1)
    param, grad = master.to(torch.bfloat16), rand(128, seed=2, dtype=torch.bfloat16)
    m, v = torch.zeros(128, dtype=torch.bfloat16), torch.zeros(128, dtype=torch.bfloat16)
    want_p, want_m, want_v = adam_definition(grad.float(), master, m.float(), v.float(), 1e-2, 0.9, 0.999, 1e-8, 1,
                                             1, 1, 0.01)
    te.tex.multi_tensor_adam(65536, torch.zeros(1, dtype=torch.int), [[grad], [param], [m], [v], [master]], 1e-2,
                             0.9, 0.999, 1e-8, 1, 1, 1, 0.01)
    assert torch.equal(param, master.to(torch.bfloat16)), "the parameter is not its master copy's cast"
    assert_close_ulps(master, want_p, want_p.abs() + 1e-2, 8, "master")
    assert m.dtype == torch.bfloat16 and torch.equal(m, want_m.float().to(torch.bfloat16)), "exp_avg not rounded"
    assert (v.double() - want_v).abs().max() <= 2.0 ** -8 * want_v.abs().max(), "exp_avg_sq not within bf16"


@pytest.mark.parametrize("master", [False, True], ids=["capturable", "capturable_master"])
def test_capturable_adam_scales_the_gradient_and_honours_the_noop_flag(te, master):
    p, g = rand(64, seed=3), rand(64, seed=4)
    m, v = torch.zeros(64), torch.zeros(64)
    lists = [[g], [p], [m], [v]] + ([[p.clone()]] if master else [])
    call = te.tex.multi_tensor_adam_capturable_master if master else te.tex.multi_tensor_adam_capturable
    args = (torch.tensor([1e-2]), 0.9, 0.999, 1e-8, torch.tensor([2], dtype=torch.int), 1, 1, 0.01,
            torch.tensor([0.5]))
    before, scaled = p.clone(), g.clone()
    call(65536, torch.ones(1, dtype=torch.int), lists, *args)
    assert torch.equal(p, before) and not m.any() and torch.equal(g, scaled), "the noop flag 1 did not skip the update"
    want_p, want_m, _ = adam_definition(g, before, m, v, 1e-2, 0.9, 0.999, 1e-8, 2, 1, 1, 0.01, inv_scale=0.5)
    call(65536, torch.zeros(1, dtype=torch.int), lists, *args)
    # adam.cu's capturable functors write g[i] = g[i] * inv_scale back (TE's test_grad_scaler_capturable compares it)
    assert torch.equal(g, scaled * 0.5), "the gradient was not unscaled in place"
    assert_close_ulps(lists[-1][0] if master else p, want_p, want_p.abs() + 1e-2, 8, "capturable param")
    # Adam's first update is nearly invariant to the gradient's scale; the moment is not
    assert_close_ulps(m, want_m, want_m.abs(), 8, "capturable exp_avg (the gradient times inv_scale)")


def sgd_definition(grad, w, m, wd, momentum, dampening, lr, nesterov, first_run, after, scale):
    g, w, m = grad.double() * f32(scale), w.double(), m.double()
    wd, momentum, dampening, lr = (f32(x) for x in (wd, momentum, dampening, lr))
    if wd and not after:
        g = g + wd * w
    if momentum:
        m = g if first_run else m * momentum + (1 - dampening) * g
        g = g + momentum * m if nesterov else m
    if wd and after:
        g = g + wd * w
    return w - lr * g, m


@pytest.mark.parametrize("nesterov,after,dampening", [(False, False, 0.0), (True, False, 0.0), (False, True, 0.25)])
def test_multi_tensor_sgd_is_sgd_cu(te, nesterov, after, dampening):
    w, m = rand(96, seed=5), torch.zeros(96)
    copy = torch.zeros(96, dtype=torch.float16)
    for step in (1, 2):
        grad = rand(96, seed=20 + step)
        want_w, want_m = sgd_definition(grad, w, m, 0.01, 0.9, dampening, 0.1, nesterov, step == 1, after, 0.5)
        te.tex.multi_tensor_sgd(65536, torch.zeros(1, dtype=torch.int), [[grad], [w], [m], [copy]], 0.01, 0.9,
                                dampening, 0.1, nesterov, step == 1, after, 0.5)
        assert_close_ulps(w, want_w, want_w.abs() + 0.1, 8, f"step {step} weight")
        assert_close_ulps(m, want_m, want_m.abs() + grad.abs().double(), 8, f"step {step} momentum")
        assert torch.equal(copy, w.to(torch.float16)), "the fp16 copy is not the weight's cast"


@pytest.mark.parametrize("call,message", [
    (lambda tex: tex.multi_tensor_adam(1, torch.zeros(1, dtype=torch.int), [[torch.zeros(2)]] * 3, 1e-3, 0.9, 0.999,
                                       1e-8, 1, 1, 1, 0.0), "Expected 4 or 5 tensor lists"),
    (lambda tex: tex.multi_tensor_adam(1, torch.zeros(1, dtype=torch.int),
                                       [[torch.zeros(2)], [torch.zeros(2)], [torch.zeros(2)],
                                        [torch.zeros(2, dtype=torch.bfloat16)]], 1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0),
     "both be Float32 or both be BFloat16"),
    (lambda tex: tex.multi_tensor_sgd(1, torch.zeros(1, dtype=torch.int),
                                      [[torch.zeros(2, dtype=torch.bfloat16)], [torch.zeros(2)], [torch.zeros(2)]],
                                      0.0, 0.9, 0.0, 0.1, False, True, False, 1.0), "Unsupported combination"),
], ids=["adam-lists", "adam-moments", "sgd-types"])
def test_the_kernels_checks(te, call, message):
    with pytest.raises(RuntimeError, match=message):
        call(te.tex)


@pytest.mark.parametrize("fused,reference", [
    ("FusedAdam", lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1)),
    ("FusedAdamW", lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)),
    ("FusedSGD", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
])
def test_te_fused_optimizers_train_as_torch_optim(te, fused, reference):
    make = {"FusedAdam": lambda ps: te.te.optimizers.FusedAdam(ps, lr=1e-2, weight_decay=0.1, adam_w_mode=False),
            "FusedAdamW": lambda ps: te.te.optimizers.FusedAdam(ps, lr=1e-2, weight_decay=0.1),
            "FusedSGD": lambda ps: te.te.optimizers.FusedSGD(ps, lr=0.1, momentum=0.9, nesterov=True,
                                                             weight_decay=0.01)}[fused]
    ours, theirs = [rand(32, 16, seed=7).requires_grad_()], [rand(32, 16, seed=7).requires_grad_()]
    opt_ours, opt_theirs = make(ours), reference(theirs)
    for step in range(3):
        for params, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            params[0].grad = rand(32, 16, seed=30 + step)
            opt.step()
    scale = theirs[0].detach().abs().double() + 0.1
    assert_close_ulps(ours[0].detach(), theirs[0].detach().double(), scale, 32, f"{fused} after 3 steps")
