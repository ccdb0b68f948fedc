"""Where a weight gradient goes: returned, accumulated into main_grad, or queued; the dummy wgrad cache.

Follows the contract table (contract.py): the value backward returns for a weight is the wgrad, None, or
a shared dummy tensor (with grad_added_to_main_grad set True).
"""
from __future__ import annotations

import torch

from te_verify.te.reference import contract

_DUMMIES: dict[tuple[tuple[int, ...], torch.dtype, torch.device], torch.Tensor] = {}


def get_dummy_wgrad(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                    zero: bool = False) -> torch.Tensor:
    """One cached tensor per (shape, dtype, device), shared by all parameters, as TE's get_dummy_wgrad."""
    key = (tuple(shape), dtype, device)
    if key not in _DUMMIES:
        _DUMMIES[key] = torch.empty(shape, dtype=dtype, device=device)
    if zero:
        _DUMMIES[key].zero_()
    return _DUMMIES[key]


def accumulate_main_grad(param: torch.nn.Parameter, wgrad: torch.Tensor) -> None:
    """main_grad += wgrad, or main_grad = wgrad when the param says overwrite_main_grad."""
    if getattr(param, "overwrite_main_grad", False):
        param.main_grad.copy_(wgrad)
    else:
        param.main_grad.add_(wgrad.to(param.main_grad.dtype))


def returned_wgrad(kind: str, param: torch.nn.Parameter, wgrad: torch.Tensor | None, fuse: bool, delay: bool,
                   variant: str = "intended") -> torch.Tensor | None:
    """What backward hands autograd for `param` (wgrad already accumulated into main_grad when fused)."""
    added = hasattr(param, "grad_added_to_main_grad")
    ret = contract.row(kind, contract.config_name(delay, fuse, added), variant).returns
    if ret == "wgrad":
        return wgrad
    if ret == "dummy":
        param.grad_added_to_main_grad = True
        return get_dummy_wgrad(tuple(param.shape), param.dtype, param.device,
                               zero=getattr(param, "zero_out_wgrad", False))
    return None


def store_delayed(param: torch.nn.Parameter, wgrad: torch.Tensor, fuse: bool, overwrite_grad: bool) -> None:
    """backward_dw's write: into main_grad when fused, else into .grad (accumulate; TE overwrites, issue 3437)."""
    if fuse:
        accumulate_main_grad(param, wgrad)
    elif param.grad is None or overwrite_grad:
        param.grad = wgrad.to(param.dtype)
    else:
        param.grad = param.grad + wgrad.to(param.dtype)
