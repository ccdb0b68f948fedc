"""A thunder executor that serves linear with the reference runtime, the way thunder 0.2.6's
transformer_engine_ex (v2) does: a forward symbol returns the output and the input/weight copies to save,
a backward symbol returns the input and weight gradients together.

It is registered through thunder's extension API (`thunder.extend.StatefulExecutor`, one FP8 state per
linear call site, like transformer_engine_ex). By default it computes only the gradients the trace needs
(flags fixed at trace time and passed to both symbols, so the forward also saves only what that backward
uses). A weight's flag is its requires_grad (reliable for parameters); whether a linear's input needs a
gradient comes from `NeedsGradAnalysis`, a transform that propagates requires_grad through the trace
itself, because thunder 0.2.6 does not propagate it to intermediate proxies (thunder issue 1768). `make_executor(always_wgrad=True)` reproduces upstream: the weight
gradient is computed and put unconditionally (thunder issue 2076).
"""
from __future__ import annotations

import math

import torch

from te_verify.compat.thunder_named_tensors import import_thunder
from te_verify.reference.autocast import get_fp8_recipe, is_fp8_enabled
from te_verify.reference.fp8 import fp8_dims_ok
from te_verify.reference.functional import LayerState, linear_backward, linear_forward

thunder = import_thunder()
from thunder.core import dtypes, prims  # noqa: E402
from thunder.core.prims import get_grad, put_grad  # noqa: E402
from thunder.core.proxies import AnyProxy, Proxy, TensorProxy  # noqa: E402
from thunder.core.pytree import tree_flatten  # noqa: E402
from thunder.extend import StatefulExecutor, register_executor  # noqa: E402
import thunder.torch as ltorch  # noqa: E402

# data_ptr of a parameter -> its layer label, set by the backend so the GEMM log names layers.
LAYER_NAMES: dict[int, str] = {}
_EXECUTORS: dict[tuple[bool, bool], StatefulExecutor] = {}
# Proxy name -> does its value need a gradient, from the last NeedsGradAnalysis run.
NEEDS_GRAD: dict[str, bool] = {}


def _proxies(tree) -> list[Proxy]:
    return [p for p in tree_flatten(tree)[0] if isinstance(p, Proxy)]


class NeedsGradAnalysis(thunder.Transform):
    """Before autodiff: a value needs a gradient iff some input of the op producing it does."""

    def transform_traces_pre_prologue(self, prologue_trc, computation_trc, epilogue_trc, **kwargs):
        NEEDS_GRAD.clear()
        for arg in _proxies((computation_trc.args, computation_trc.kwargs)):
            NEEDS_GRAD[arg.name] = bool(getattr(arg, "requires_grad", False))
        for bsym in computation_trc.bound_symbols:
            needs = any(NEEDS_GRAD.get(p.name, False) for p in _proxies((bsym.args, bsym.kwargs)))
            for out in _proxies(bsym.output):
                NEEDS_GRAD[out.name] = NEEDS_GRAD.get(out.name, False) or needs
        return prologue_trc, computation_trc, epilogue_trc


def label_layers(model: torch.nn.Module) -> None:
    """Name each weight's layer (its module's qualified name) for the GEMM log."""
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.nn.Parameter):
            LAYER_NAMES[weight.data_ptr()] = name


def _fp8_dtype_now() -> dtypes.dtype | None:
    if not is_fp8_enabled():
        return None
    fwd = get_fp8_recipe().fp8_format.fwd_dtype
    return dtypes.float8_e4m3fn if fwd == torch.float8_e4m3fn else dtypes.float8_e5m2


def _build(always_wgrad: bool, free_saved: bool) -> StatefulExecutor:
    name = "te_verify_reference" + ("_always_wgrad" if always_wgrad else "") + ("_freeing" if free_saved else "")
    ex = StatefulExecutor(name)
    register_executor(ex)

    class SiteState:
        def __init__(self):
            self.state = LayerState("?", free_saved)

        def __call__(self) -> LayerState:
            return self.state

    get_state = ex.register_stateful_operator("refte_layer_state", SiteState, meta=lambda: AnyProxy(None, prefix="s"))

    def fwd_meta(a, w, bias, state, need_wgrad, need_dgrad):
        rows = math.prod(a.shape[:-1])
        fp8 = _fp8_dtype_now()
        out = TensorProxy(like=a, shape=(*a.shape[:-1], w.shape[0]))
        saved_a = TensorProxy(like=a, shape=(rows, a.shape[-1]), dtype=fp8 or a.dtype) if need_wgrad else None
        saved_w = TensorProxy(like=w, dtype=fp8 or w.dtype) if need_dgrad else None
        return out, saved_a, saved_w, TensorProxy(like=a, shape=(3,), dtype=dtypes.float32)

    def fwd_impl(a, w, bias, state, need_wgrad, need_dgrad):
        state.label = LAYER_NAMES.get(w.data_ptr(), state.label)
        return linear_forward(state, a, w, bias, need_wgrad, need_dgrad)

    fwd = ex.register_operator("refte_linear_fwd", meta=fwd_meta, fn=fwd_impl)

    def bwd_meta(g, saved_a, saved_w, meta, state, a_shape, w_like, bias_like, need_dgrad, need_wgrad, need_bgrad):
        dgrad = TensorProxy(like=g, shape=a_shape) if need_dgrad else None
        wgrad = TensorProxy(like=w_like) if need_wgrad else None
        bgrad = TensorProxy(like=bias_like) if need_bgrad else None
        return dgrad, wgrad, bgrad

    def bwd_impl(g, saved_a, saved_w, meta, state, a_shape, w_like, bias_like, need_dgrad, need_wgrad, need_bgrad):
        dgrad, wgrad, bgrad = linear_backward(state, g, saved_a, saved_w, meta, need_dgrad, need_wgrad, need_bgrad)
        return dgrad, (wgrad.to(g.dtype) if wgrad is not None else None), bgrad

    bwd = ex.register_operator("refte_linear_bwd", meta=bwd_meta, fn=bwd_impl)

    def checker(a, w, bias) -> bool:
        """Claim every linear, except FP8 shapes the GEMM refuses (left to torch, as upstream's checker does)."""
        if _fp8_dtype_now() is None:
            return True
        return fp8_dims_ok((math.prod(a.shape[:-1]), a.shape[-1])) and fp8_dims_ok(tuple(w.shape))

    def execution_transform(a, w, bias):
        out, _, _, _ = fwd(a, w, bias, get_state(), False, False)
        return out

    def grad_transform(a, w, bias):
        need_wgrad = always_wgrad or w.requires_grad
        need_dgrad = NEEDS_GRAD.get(a.name, True)  # unknown to the analysis: compute it (never drop a needed grad)
        need_bgrad = bias is not None and bias.requires_grad
        state = get_state()
        out, saved_a, saved_w, meta = fwd(a, w, bias, state, need_wgrad, need_dgrad)
        g = get_grad(out)
        dgrad, wgrad, bgrad = bwd(g, saved_a, saved_w, meta, state, tuple(a.shape), w, bias, need_dgrad, need_wgrad, need_bgrad)
        if need_dgrad:
            put_grad(a, dgrad)
        if need_wgrad:
            put_grad(w, wgrad)
        if need_bgrad:
            put_grad(bias, bgrad)
        return out

    ex.register_implementation(prims.linear, checker=checker, execution_transform=execution_transform,
                               grad_transform=grad_transform)
    # Without autodiff thunder lowers at the torch level; claim it there too so inference runs on FP8.
    ex.register_implementation(ltorch.linear, checker=checker, execution_transform=execution_transform)
    return ex


def make_executor(always_wgrad: bool = False, free_saved: bool = False) -> StatefulExecutor:
    """The executor (one per switch combination, registered once per process)."""
    key = (always_wgrad, free_saved)
    if key not in _EXECUTORS:
        _EXECUTORS[key] = _build(always_wgrad, free_saved)
    return _EXECUTORS[key]
