"""tex's fused optimizer kernels behind TE's FusedAdam and FusedSGD (multi_tensor_adam, its capturable and
capturable-master forms, multi_tensor_sgd) as common/multi_tensor/adam.cu and sgd.cu compute them, main d0067d0.

Each takes (chunk_size, noop_flag, tensor_lists, ...) from TE's multi_tensor_applier and updates the lists' tensors
in place, elementwise in fp32 (MATH_T float), in the kernels' operation order:
- Adam, L2 mode (0): g += decay p; AdamW mode (1): the decay joins the update. m = b1 m + (1 - b1) g,
  v = b2 v + (1 - b2) g g, update = (m / c1) / (sqrt(v / c2) + eps) [+ decay p], p -= lr update; c1, c2 the bias
  corrections 1 - b^step: on the host in double, rounded to float (multi_tensor_adam: std::pow(float, int)), in the
  kernel in float (capturable forms: pow(float, int)); 1 without bias correction. Lists g, p, m, v[, p_master]: with
  a master copy the math reads and writes it and p gets its cast. Moments fp32 or bf16 (rounded when stored).
- The capturable forms take lr and step as tensors, multiply g by inv_scale first and store it back into g, and do
  nothing when noop_flag is 1 (multi_tensor_adam ignores the flag: it propagates inf/nan).
- SGD: g = grad scale (+ wd w before momentum), momentum m = m momentum + (1 - dampening) g (g on the first run),
  nesterov g += momentum m else g = m, (+ wd w after momentum), w -= lr g; a 4th list receives w as fp16; the flag
  1 skips the update. sgd.cu's four dtype combinations only.
nvcc may contract a * b + c into one FMA; PyTorch here rounds each product: within a few fp32 ulps of the kernels.
Not emulated (refused): multi_tensor_adam_fp8, multi_tensor_adam_param_remainder.
"""
from __future__ import annotations

import math

import torch

from te_verify.te.tecpu.activation import fp32
from te_verify.te.tecpu.writes import write

F32 = torch.float32


def _check_lists(tensor_lists: list[list[torch.Tensor]], counts: tuple[int, ...]) -> None:
    if len(tensor_lists) not in counts:
        raise RuntimeError(f"Expected {' or '.join(map(str, counts))} tensor lists, but found {len(tensor_lists)}")
    for i, tensors in enumerate(tensor_lists[1:], 1):
        if len(tensors) != len(tensor_lists[0]):
            raise RuntimeError(f"Tensor list {i} has size={len(tensors)}, but expected size={len(tensor_lists[0])}")


def _check_adam_dtypes(tensor_lists: list[list[torch.Tensor]], param_is_grad_dtype: bool) -> None:
    grad_dtype, param_dtype = tensor_lists[0][0].dtype, tensor_lists[1][0].dtype
    for j in range(len(tensor_lists[0])):
        g, p, m, v = (tensor_lists[k][j] for k in range(4))
        if g.dtype != grad_dtype:
            raise RuntimeError(f"Grad tensor {j} has dtype={g.dtype}, but expected dtype={grad_dtype}")
        want = grad_dtype if param_is_grad_dtype else param_dtype
        if p.dtype != want:
            raise RuntimeError(f"Param tensor {j} has dtype={p.dtype}, but expected dtype={want}")
        if not (m.dtype == v.dtype and m.dtype in (F32, torch.bfloat16)):
            raise RuntimeError(f"First and second moment tensors must both be Float32 or both be BFloat16, but tensor "
                               f"{j} has first moment dtype={m.dtype} and second moment dtype={v.dtype}")
        if len(tensor_lists) == 5 and tensor_lists[4][j].dtype != F32:
            raise RuntimeError(f"Master param tensor {j} has dtype={tensor_lists[4][j].dtype}, but expected "
                               f"dtype=torch.float32")


def _adam_step(tensors: list[torch.Tensor], lr: torch.Tensor, beta1: float, beta2: float, epsilon: float,
               corrections: tuple[torch.Tensor, torch.Tensor], mode: int, decay: float,
               inv_scale: torch.Tensor | None = None) -> None:
    """One tensor's update: tensors g, p, m, v[, p_master]."""
    g, p, m, v = tensors[:4]
    master = tensors[4] if len(tensors) == 5 else p
    b1, b2, eps, wd = fp32(beta1), fp32(beta2), fp32(epsilon), fp32(decay)
    r_g, r_p, r_m, r_v = g.to(F32), master.to(F32), m.to(F32), v.to(F32)
    if inv_scale is not None:  # the capturable kernels unscale the gradient in place (GradScaler's unscale_)
        r_g = r_g * inv_scale
        write(g, r_g.to(g.dtype))
    if mode == 0:
        r_g = r_g + wd * r_p
    r_m = b1 * r_m + (1 - b1) * r_g
    r_v = b2 * r_v + (1 - b2) * r_g * r_g
    update = (r_m / corrections[0]) / (torch.sqrt(r_v / corrections[1]) + eps)
    if mode != 0:
        update = update + wd * r_p
    r_p = r_p - lr * update
    for dst, value in ((master, r_p), (m, r_m), (v, r_v)) + (((p, r_p),) if master is not p else ()):
        write(dst, value.to(dst.dtype))


def _host_corrections(beta1: float, beta2: float, step: int, bias_correction: int) -> tuple[torch.Tensor, ...]:
    """adam.cu's host code: 1 - std::pow(float beta, int step) in double, stored in a float."""
    if bias_correction != 1:
        return fp32(1.0), fp32(1.0)
    return tuple(fp32(1 - math.pow(float(fp32(beta)), step)) for beta in (beta1, beta2))


def _kernel_corrections(beta1: float, beta2: float, step: torch.Tensor, bias_correction: int) -> tuple[torch.Tensor, ...]:
    """The capturable kernels' 1 - pow(float beta, int step), in float."""
    if bias_correction != 1:
        return fp32(1.0), fp32(1.0)
    exponent = step.reshape(()).to(F32)
    return tuple(1 - torch.pow(fp32(beta), exponent) for beta in (beta1, beta2))


def multi_tensor_adam(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], lr: float,
                      beta1: float, beta2: float, epsilon: float, step: int, mode: int, bias_correction: int,
                      weight_decay: float) -> None:
    """tex.multi_tensor_adam: lists g, p, m, v[, p_master]; the noop flag is not read."""
    _check_lists(tensor_lists, (4, 5))
    _check_adam_dtypes(tensor_lists, param_is_grad_dtype=False)
    corrections = _host_corrections(beta1, beta2, step, bias_correction)
    for tensors in zip(*tensor_lists):
        _adam_step(list(tensors), fp32(lr), beta1, beta2, epsilon, corrections, mode, weight_decay)


def _capturable(lists: int, chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                lr: torch.Tensor, beta1: float, beta2: float, epsilon: float, step: torch.Tensor, mode: int,
                bias_correction: int, weight_decay: float, inv_scale: torch.Tensor) -> None:
    _check_lists(tensor_lists, (lists,))
    _check_adam_dtypes(tensor_lists, param_is_grad_dtype=True)
    if int(noop_flag.reshape(-1)[0]) == 1:
        return
    corrections = _kernel_corrections(beta1, beta2, step, bias_correction)
    scale = inv_scale.reshape(-1)[0].to(F32)
    for tensors in zip(*tensor_lists):
        _adam_step(list(tensors), lr.reshape(-1)[0].to(F32), beta1, beta2, epsilon, corrections, mode, weight_decay,
                   scale)


def multi_tensor_adam_capturable(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                                 lr: torch.Tensor, beta1: float, beta2: float, epsilon: float, step: torch.Tensor,
                                 mode: int, bias_correction: int, weight_decay: float,
                                 inv_scale: torch.Tensor) -> None:
    """tex.multi_tensor_adam_capturable: lists g, p, m, v (p in g's dtype); lr, step and inv_scale tensors."""
    _capturable(4, chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step, mode, bias_correction,
                weight_decay, inv_scale)


def multi_tensor_adam_capturable_master(chunk_size: int, noop_flag: torch.Tensor,
                                        tensor_lists: list[list[torch.Tensor]], lr: torch.Tensor, beta1: float,
                                        beta2: float, epsilon: float, step: torch.Tensor, mode: int,
                                        bias_correction: int, weight_decay: float, inv_scale: torch.Tensor) -> None:
    """tex.multi_tensor_adam_capturable_master: lists g, p, m, v, p_master (fp32)."""
    _capturable(5, chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step, mode, bias_correction,
                weight_decay, inv_scale)


SGD_TYPES = {(torch.float16, torch.float16, 3), (F32, F32, 3), (torch.float16, F32, 4), (F32, F32, 4)}


def multi_tensor_sgd(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], wd: float,
                     momentum: float, dampening: float, lr: float, nesterov: bool, first_run: bool,
                     wd_after_momentum: bool, scale: float) -> None:
    """tex.multi_tensor_sgd: lists grad, weight, momentum[, fp16 weight copy]."""
    _check_lists(tensor_lists, (3, 4))
    if len(tensor_lists) == 4 and any(t.dtype != torch.float16 for t in tensor_lists[3]):
        raise RuntimeError("Additional output tensors should always be fp16.")
    if (tensor_lists[0][0].dtype, tensor_lists[1][0].dtype, len(tensor_lists)) not in SGD_TYPES:
        raise RuntimeError("Unsupported combination of weight and gradient types.")
    if int(noop_flag.reshape(-1)[0]):
        return
    wd_, mom, damp = fp32(wd), fp32(momentum), fp32(dampening)
    for tensors in zip(*tensor_lists):
        grad, weight, moms = tensors[:3]
        g, w, m = grad.to(F32) * fp32(scale), weight.to(F32), moms.to(F32)
        if wd != 0 and not wd_after_momentum:
            g = g + wd_ * w
        if momentum != 0:
            m = g if first_run else m * mom + (1 - damp) * g
            g = g + mom * m if nesterov else m
        if wd != 0 and wd_after_momentum:
            g = g + wd_ * w
        w = w + (-fp32(lr) * g)
        write(weight, w.to(weight.dtype))
        if len(tensors) == 4:
            write(tensors[3], weight.to(torch.float16))
        if momentum != 0:
            write(moms, m.to(moms.dtype))


def functions() -> dict[str, object]:
    """The emulated tex functions of this module, by name."""
    return {"multi_tensor_adam": multi_tensor_adam, "multi_tensor_adam_capturable": multi_tensor_adam_capturable,
            "multi_tensor_adam_capturable_master": multi_tensor_adam_capturable_master,
            "multi_tensor_sgd": multi_tensor_sgd}
