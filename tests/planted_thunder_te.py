"""A planted thunder TE executor with the fix of thunder PR 2138 / 1838's idea: tell TE which gradients are needed.

thunder 0.2.6's transformer_engine_ex calls BasicLinear._functional_forward/_functional_backward without
input_requires_grad / weight_requires_grad (TE defaults both to True) and put_grad's every result, so frozen
weights get a wgrad GEMM and their inputs' FP8 copies are kept (thunder issue 2076). This executor claims the same
linears with one change: TE is told which gradients are needed, the backward only receives the copies its GEMMs
read, and only needed gradients are put. Everything else is thunder's own executor (its recipe, state, quantizer
and amax-update operators), so `FixedThunderTE` differs from thunder_te in exactly that fix.

Which gradients are needed cannot be read off the trace's requires_grad: on intermediate proxies it is unreliable
(thunder issue 1768); taking it as is leaves trainable weights without gradients (thunder issue 1966, why PR 1838
was reverted; tests/test_te_planted.py shows it). thunder PR 2138 derived it from the backward trace; this planted
executor propagates it along the trace order instead (a linear's input needs grad if the model input does or an
earlier linear has something trainable), which is exact for the linear chains of the TE families.
"""
from __future__ import annotations

import functools

from te_verify.backends.thunder_te import ThunderTEBackend
from te_verify.compat.thunder import import_thunder


_UPSTREAM_NEEDS_GRAD = [False]  # reset by FixedThunderTE.prepare; read and set in trace order by grad_transform
_PROPAGATE = [True]  # False: take requires_grad from the trace alone (the reverted PR 1838, thunder issue 1966)


@functools.cache
def _fixed_executor():
    """Built on first use: importing thunder needs TE booted first (te_api.ensure_te_importable)."""
    import_thunder()
    import thunder.executors.transformer_engineex_impl as impl
    from thunder.core.prims import get_grad, linear as linear_prim, put_grad
    from thunder.core.proxies import TensorProxy
    from thunder.extend import OperatorExecutor
    from transformer_engine.pytorch.ops import BasicLinear

    ex = OperatorExecutor("transformer_engine_fixed")

    def fwd_meta(a, w, bias, input_q, weight_q, a_needs, w_needs):
        return TensorProxy(like=a, shape=(*a.shape[:-1], w.shape[0])), TensorProxy(like=a), TensorProxy(like=w)

    def fwd_impl(a, w, bias, input_q, weight_q, a_needs, w_needs):
        return BasicLinear._functional_forward(
            input=a, weight=w, bias=bias, dtype=w.dtype, with_quantized_compute=True, input_quantizer=input_q,
            weight_quantizer=weight_q, output_quantizer=None, input_requires_grad=a_needs,
            weight_requires_grad=w_needs)

    def bwd_meta(g, qa, qw, input_q, weight_q, grad_q, a_shape, w_shape, a_needs, w_needs):
        return TensorProxy(like=g, shape=a_shape), TensorProxy(like=g, shape=w_shape)

    def bwd_impl(g, qa, qw, input_q, weight_q, grad_q, a_shape, w_shape, a_needs, w_needs):
        dx, dw = BasicLinear._functional_backward(
            grad_output=g, input=qa, weight=qw, input_requires_grad=a_needs, weight_requires_grad=w_needs,
            with_quantized_compute=True, input_quantizer=input_q, weight_quantizer=weight_q,
            grad_output_quantizer=grad_q)
        return (dx if a_needs else g.new_empty(a_shape)), (dw if w_needs else g.new_empty(w_shape))

    fwd = ex.register_operator("te_fixed_linear_fwd", meta=fwd_meta, fn=fwd_impl)
    bwd = ex.register_operator("te_fixed_linear_bwd", meta=bwd_meta, fn=bwd_impl)

    def grad_transform(a, w, bias):
        a_needs = bool(a.requires_grad) or (_PROPAGATE[0] and _UPSTREAM_NEEDS_GRAD[0])
        w_needs = bool(w.requires_grad)
        b_needs = bias is not None and bool(bias.requires_grad)
        _UPSTREAM_NEEDS_GRAD[0] = a_needs or w_needs or b_needs
        recipe = impl._get_te_fp8_recipe()
        fwd_state = impl._get_te_fp8_state(recipe, "forward", 2)
        input_q, weight_q = impl._get_te_fp8_quantizers(fwd_state, 2)
        out, qa, qw = fwd(a, w, bias, input_q, weight_q, a_needs, w_needs)
        out, qa, qw = impl._te_fp8_amax_and_scale_update(recipe, states=(fwd_state,), tokens=(out, qa, qw))
        g = get_grad(out)
        bwd_state = impl._get_te_fp8_state(recipe, "backward", 1)
        (grad_q,) = impl._get_te_fp8_quantizers(bwd_state, 1)
        dx, dw = bwd(g, qa if w_needs else None, qw if a_needs else None, input_q, weight_q, grad_q,
                     tuple(a.shape), tuple(w.shape), a_needs, w_needs)
        dx, dw = impl._te_fp8_amax_and_scale_update(recipe, states=(bwd_state,), tokens=(dx, dw))
        if a_needs:
            put_grad(a, dx)
        if w_needs:
            put_grad(w, dw)
        if b_needs:
            put_grad(bias, impl.ltorch.sum(g, tuple(range(g.ndim - 1))))
        return out

    checker = impl.transformer_engine_ex.implmap[linear_prim.id].checker  # thunder's (with the CPU device step)
    ex.register_implementation(linear_prim, checker=checker,
                               execution_transform=impl._te_linear_execution_transform, grad_transform=grad_transform)
    return ex, impl


class FixedThunderTE(ThunderTEBackend):
    """thunder_te with the planted fix; named thunder_te so thunder_te's expectations apply to it."""

    def __init__(self, propagate: bool = True) -> None:
        super().__init__(executors=self._executors, transforms=self._transforms)
        self.propagate = propagate

    def prepare(self, model, spec):
        _UPSTREAM_NEEDS_GRAD[0], _PROPAGATE[0] = False, self.propagate  # the next trace starts at the model input
        return super().prepare(model, spec)

    @staticmethod
    def _executors() -> list:
        ex, impl = _fixed_executor()
        return [ex, impl.transformer_engine_ex]

    @staticmethod
    def _transforms() -> list:
        from thunder.executors.transformer_engineex import TransformerEngineTransform

        return [TransformerEngineTransform()]

