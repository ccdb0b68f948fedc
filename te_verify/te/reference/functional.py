"""The linear GEMMs of one layer, forward and backward, as plain functions (shared by the modules and
the thunder executor). Work is exactly what the flags ask for; every GEMM and saved tensor is logged.

Saved state travels as tensors, in TE's per-tensor FP8 format: the input copy and its scale_inv (None unless
wgrad is needed), the weight copy and its scale_inv (None unless dgrad is needed), and a 1-element `meta`
(the FP8 flag). A layer that frees its state after backward empties `meta`'s storage; a second backward then
raises as TE does.
"""
from __future__ import annotations

import contextlib
import functools
import operator
from typing import Callable, Iterator

import torch

from te_verify.te.reference.autocast import get_fp8_recipe, is_fp8_enabled, note_forward_scaler
from te_verify.te.reference.block_recipe import BlockScaler, is_block
from te_verify.te.reference.fp8 import TensorScaler, assert_fp8_dims
from te_verify.te.reference.gemm_log import Operand, bias_grad, fp8_operand, gemm, log_saved
from te_verify.te.reference.recipe import Recipe


class LayerState:
    """FP8 scaling state and identity of one linear site (one module, one group, or one traced call)."""

    def __init__(self, label: str, free_saved: bool = False) -> None:
        self.label = label
        self.free_saved = free_saved
        self.recipe: Recipe | None = None
        self.scalers: dict[str, TensorScaler] = {}
        # TE's is_first_microbatch of the current forward: True quantizes the weight and keeps the copy, False reuses
        # the kept copy (no new quantization, no amax recorded for it), None quantizes anew and keeps nothing.
        self.first_microbatch: bool | None = None
        self.weight_copy = None

    def quantized_weight(self, w: torch.Tensor, recipe: Recipe):
        """The FP8 weight for this forward, as is_first_microbatch says (see first_microbatch)."""
        if self.first_microbatch is False and self.weight_copy is not None:
            return self.weight_copy
        qw = self.scaler("weight", recipe, w.device).quantize(w)
        self.weight_copy = qw if self.first_microbatch else None
        return qw

    def scaler(self, slot: str, recipe: Recipe, device: torch.device) -> TensorScaler | BlockScaler:
        """The slot's scaling state, made on `device` (the tensors it scales) on first use."""
        if recipe is not self.recipe:
            self.recipe, self.scalers = recipe, {}
        if slot not in self.scalers and is_block(recipe):
            self.scalers[slot] = BlockScaler(recipe, slot)
        if slot not in self.scalers:
            fmt = recipe.fp8_format
            dtype = fmt.bwd_dtype if slot == "grad_output" else fmt.fwd_dtype
            self.scalers[slot] = TensorScaler(recipe, dtype, device)
        return self.scalers[slot]


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


# How an FP8 GEMM's bias epilogue takes an fp32 bias: TE's Linear and GroupedLinear modules cast it to bf16, cuBLAS
# having no FP8 GEMM with an fp32 bias (module/linear.py and grouped_linear.py, `bias_dtype`); te.ops' BasicLinear
# and GroupedLinear (which thunder's TE executor calls too) pass it as it is. `ops_bias_epilogue` selects the latter.
_CAST_FP8_BIAS: list[bool] = [True]


@contextlib.contextmanager
def ops_bias_epilogue() -> Iterator[None]:
    """Inside the block FP8 GEMMs add an fp32 bias as it is, as te.ops does."""
    _CAST_FP8_BIAS.append(False)
    try:
        yield
    finally:
        _CAST_FP8_BIAS.pop()


def epilogue_bias(b: torch.Tensor, fp8: bool) -> torch.Tensor:
    """The bias a GEMM adds: see _CAST_FP8_BIAS; a high-precision GEMM adds it as it is."""
    cast = fp8 and _CAST_FP8_BIAS[-1] and b.dtype in (torch.float32, torch.float64)
    return b.to(torch.bfloat16) if cast else b


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype TE computes a layer in under torch.autocast (its `activation_dtype`), None outside one."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


def linear_forward(state: LayerState, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                   need_wgrad: bool, need_dgrad: bool):
    """out = x @ w.T + b; returns (out, saved) with saved = (x copy, its scale_inv, w copy, its scale_inv, meta).
    The copies saved are those backward reads: a block-scaled recipe's columnwise copies (block_recipe).

    Under torch.autocast, as TE's modules (base.py set_activation_dtype, linear.py cast_if_needed): the input and
    weight cast to the autocast's dtype where not quantized, the bias cast to it, the output in it (so the casts are
    what backward keeps), and the GEMM itself not autocast (TE's is no aten op)."""
    act = autocast_dtype(x)
    if act is None:
        return _forward(state, x, w, b, need_wgrad, need_dgrad, x.dtype)
    fp8 = is_fp8_enabled()
    with torch.autocast(x.device.type, enabled=False):
        return _forward(state, x if fp8 else x.to(act), w if fp8 else w.to(act), None if b is None else b.to(act),
                        need_wgrad, need_dgrad, act)


def _forward(state: LayerState, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, need_wgrad: bool,
             need_dgrad: bool, out_dtype: torch.dtype):
    fp8 = gemm_fp8 = is_fp8_enabled()
    x2d = _as_2d(x)
    meta = torch.tensor([float(fp8)], device=x.device)
    x_si = w_si = None
    if fp8:
        assert_fp8_dims(x2d)
        assert_fp8_dims(w)
        recipe = get_fp8_recipe()
        qx = state.scaler("input", recipe, x2d.device).quantize(x2d)
        qw = state.quantized_weight(w, recipe)
        for slot in ("input", "weight"):
            note_forward_scaler(state.scalers[slot])
        x_op, w_op = fp8_operand(qx.data, qx.scale_inv), fp8_operand(qw.data, qw.scale_inv)
        (bx, bx_si), (bw, bw_si) = qx.backward_copy(), qw.backward_copy()
        saved_x, saved_w = (bx if need_wgrad else None), (bw if need_dgrad else None)
        x_si, w_si = (bx_si if need_wgrad else None), (bw_si if need_dgrad else None)
        gemm_fp8 = getattr(qx, "quantized", (True,))[0]  # a CustomRecipe may run fprop in high precision
    else:
        x_op, w_op = Operand(x2d), Operand(w)
        saved_x, saved_w = (x2d if need_wgrad else None), (w if need_dgrad else None)
    out = scaled_gemm(state.label, "fprop", x_op, w_op.t(), gemm_fp8)
    if b is not None:
        out = out + epilogue_bias(b, fp8).to(out.dtype)  # TE casts by the autocast, not by the GEMM's operands
    if saved_x is not None:
        log_saved(state.label, "input", saved_x.numel() * saved_x.element_size() if fp8 else 0, fp8)
    if saved_w is not None:
        log_saved(state.label, "weight", saved_w.numel() * saved_w.element_size() if fp8 else 0, fp8)
    return out.to(out_dtype).reshape(*x.shape[:-1], w.shape[0]), (saved_x, x_si, saved_w, w_si, meta)


def check_alive(state: LayerState, meta: torch.Tensor) -> None:
    """TE frees saved state in backward; a second backward finds it gone (TE issue 990)."""
    if meta.untyped_storage().size() == 0:
        raise AttributeError(f"layer {state.label}: ctx must have .tensor_objects to restore saved tensors; "
                             "they were freed by the first backward (retain_graph is not supported)")


def free(meta: torch.Tensor) -> None:
    meta.untyped_storage().resize_(0)


def _operand(saved: torch.Tensor, scale_inv: torch.Tensor | None, fp8: bool) -> Operand:
    return fp8_operand(saved, scale_inv) if fp8 else Operand(saved)


def scaled_gemm(layer: str, role: str, a: Operand, b: Operand, fp8: bool) -> torch.Tensor:
    """a @ b as TE's GEMM computes it: the sum of the operands' values (functional.gemm, which tests may replace),
    then scaled by the product of their per-tensor factors (cuBLAS's scale_inv_A x scale_inv_B), if any."""
    out = gemm(layer, role, a.values, b.values, fp8)
    factors = [f for f in (a.factor, b.factor) if f is not None]
    return out * functools.reduce(operator.mul, factors) if factors else out


def linear_backward(state: LayerState, grad_out: torch.Tensor, saved: tuple, need_dgrad: bool, need_wgrad: bool,
                    need_bgrad: bool, defer_wgrad: bool = False, wgrad_dtype: torch.dtype | None = None):
    """Returns (dgrad | None, wgrad | deferred wgrad thunk | None, bgrad | None), computing only what is asked.
    `wgrad_dtype`: the dtype the wgrad GEMM emits (TE: the activation dtype, bf16 under torch.autocast, unless it
    accumulates into main_grad; linear.py `wgrad_gemm_kwargs["out_dtype"]`); None keeps the accumulation dtype."""
    saved_x, x_si, saved_w, w_si, meta = saved
    check_alive(state, meta)
    fp8 = bool(meta[0])
    g2d = _as_2d(grad_out)
    if fp8:
        scaler = state.scaler("grad_output", state.recipe, g2d.device)
        qg = scaler.quantize(g2d)
        g_op = fp8_operand(qg.data, qg.scale_inv)
        g_col = fp8_operand(*qg.backward_copy())
        scaler.update()
    else:
        g_op = g_col = Operand(g2d)
    dgrad = wgrad = bgrad = None
    if need_dgrad:
        w_op = _operand(saved_w, w_si, fp8)
        dgrad = scaled_gemm(state.label, "dgrad", g_op, w_op, fp8).to(grad_out.dtype)
        dgrad = dgrad.reshape(*grad_out.shape[:-1], w_op.shape[1])
    if need_wgrad:
        x_op = _operand(saved_x, x_si, fp8)
        wgrad = wgrad_thunk(state.label, g_col, x_op, fp8, wgrad_dtype)
        wgrad = wgrad if defer_wgrad else wgrad()
    if need_bgrad:
        bgrad = bias_grad(state.label, g2d).to(grad_out.dtype)
    if state.free_saved:
        free(meta)
    return dgrad, wgrad, bgrad


def wgrad_thunk(label: str, g_op: Operand, x_op: Operand, fp8: bool,
                out_dtype: torch.dtype | None = None) -> Callable[[], torch.Tensor]:
    """The wgrad GEMM g.T @ x, ready to run now or later (delay_wgrad_compute), emitted in `out_dtype` if given."""
    def run() -> torch.Tensor:
        # TE's GEMM records no graph; backward_dw runs outside autograd's engine, where grad mode is on and the
        # saved input may still require grad (the case input): torch ops would build a graph and save an operand.
        with torch.no_grad():
            out = scaled_gemm(label, "wgrad", g_op.t(), x_op, fp8)
        return out if out_dtype is None else out.to(out_dtype)
    return run
