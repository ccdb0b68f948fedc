"""`Linear`: TE's Linear module on the reference runtime (FP8 under autocast, main_grad, delayed wgrad).

Class attributes select labelled behaviours, so variants (freeing.py, planted faults in tests) are small
subclasses: `free_saved_after_backward` (TE issue 990), `backward_dw_overwrites` (TE issue 3437),
`backward_dw_empty_raises` (TE's WeightGradStore.pop on an empty queue), `contract_variant`, `wgrad_in_activation_dtype`
(TE's wgrad GEMM emits the activation dtype).
"""
from __future__ import annotations

from collections import deque

import torch

from te_verify.te.reference import wgrad as wg
from te_verify.te.reference.functional import LayerState, linear_backward, linear_forward


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, module):
        need_dgrad, need_wgrad, need_bgrad = module.grad_needs(ctx.needs_input_grad[:3])
        out, saved = linear_forward(module.state, x, weight, bias, need_wgrad, need_dgrad)
        ctx.save_for_backward(*saved)
        ctx.module, ctx.needs = module, (need_dgrad, need_wgrad, need_bgrad)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        module = ctx.module
        need_dgrad, need_wgrad, need_bgrad = ctx.needs
        delay = module.delay_wgrad_compute
        # TE's wgrad GEMM emits the activation dtype (grad_out's: bf16 under torch.autocast) unless fused into main_grad
        emits = module.wgrad_in_activation_dtype and not module.fuse_wgrad_accumulation
        out_dtype = grad_out.dtype if emits else None
        dgrad, wgrad, bgrad = linear_backward(module.state, grad_out, ctx.saved_tensors,
                                              need_dgrad, need_wgrad, need_bgrad, defer_wgrad=delay,
                                              wgrad_dtype=out_dtype)
        returned = module.weight_grad_for_autograd(wgrad, delay) if need_wgrad else None
        return dgrad, returned, bgrad, None


class Linear(torch.nn.Module):
    """y = x @ weight.T + bias with TE's keyword arguments (the subset the suite uses)."""

    kind = "linear"
    free_saved_after_backward = False
    backward_dw_overwrites = False
    backward_dw_empty_raises = False
    contract_variant = "intended"
    wgrad_in_activation_dtype = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 params_dtype: torch.dtype | None = None, fuse_wgrad_accumulation: bool = False,
                 delay_wgrad_compute: bool = False, device: str | torch.device = "cpu", name: str | None = None) -> None:
        super().__init__()
        dtype = params_dtype or torch.get_default_dtype()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None
        torch.nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = delay_wgrad_compute
        self.name = name or "linear"
        self.state = LayerState(self.name, self.free_saved_after_backward)
        self.wgrad_store: deque = deque()

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        self.state.label = self.name
        self.state.first_microbatch = is_first_microbatch
        return _LinearFunction.apply(inp, self.weight, self.bias, self)

    def grad_needs(self, needs_input_grad: tuple[bool, ...]) -> tuple[bool, bool, bool]:
        """(dgrad, wgrad, bgrad) needed: exactly what autograd will ask for."""
        x_needs, w_needs, b_needs = (bool(n) for n in needs_input_grad)
        return x_needs, w_needs, b_needs and self.bias is not None

    def weight_grad_for_autograd(self, wgrad, delay: bool) -> torch.Tensor | None:
        """Route the wgrad (or queue its thunk) and return what the contract says backward returns."""
        fuse = self.fuse_wgrad_accumulation
        if delay:
            self.wgrad_store.append(wgrad)
            return wg.returned_wgrad(self.kind, self.weight, None, fuse, True, self.contract_variant)
        if fuse:
            wg.accumulate_main_grad(self.weight, wgrad)
        return wg.returned_wgrad(self.kind, self.weight, wgrad.to(self.weight.dtype), fuse, False, self.contract_variant)

    def backward_dw(self) -> None:
        """Run the queued wgrad GEMMs; accumulate into .grad (or main_grad when fused)."""
        if not self.wgrad_store:
            if self.backward_dw_empty_raises:
                raise RuntimeError("Pop empty queue. No weights to compute wgrad for.")
            return
        while self.wgrad_store:
            thunk = self.wgrad_store.popleft()
            wg.store_delayed(self.weight, thunk(), self.fuse_wgrad_accumulation, self.backward_dw_overwrites)
