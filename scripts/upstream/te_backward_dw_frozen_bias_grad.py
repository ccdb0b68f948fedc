"""Standalone reproducer for upstream (TransformerEngine): with delay_wgrad_compute=True in high precision,
backward_dw() gives a frozen bias (requires_grad=False, its weight trained) a gradient. Uses TE's public API only.

    python te_backward_dw_frozen_bias_grad.py            # on a CUDA machine with TransformerEngine installed
    python te_backward_dw_frozen_bias_grad.py --cpu      # here: TE's Python over te_verify's tex emulation

Expected: bias.grad stays None (as torch.nn.Linear's, and as TE's own without delay_wgrad_compute), and the weight's
gradient is right. Seen with TE 2.20.2's Python: te.Linear and te.GroupedLinear in high precision assign bias.grad in
backward_dw() (module/base.py backward_dw assigns the queued bias gradient whenever bias.grad is None, never reading
bias.requires_grad; GroupedLinear.backward_dw likewise). Undelayed, and under FP8, bias.grad stays None.
Seen with TE 2.14.0's Python: the same in high precision, and under FP8 backward_dw() raises AttributeError:
'NoneType' object has no attribute 'to' (module/base.py:1579; fixed by TE PR 3400).
"""
import argparse
import contextlib
import sys

import torch

ROWS, WIDTH, EXPERTS = 32, 32, 2  # 16 rows per expert: an FP8 wgrad GEMM needs a multiple of 16


def build(te, kind: str, delay: bool, device: str):
    """A module of `kind` with a trained weight and a frozen bias."""
    if kind == "Linear":
        module = te.Linear(WIDTH, WIDTH, bias=True, params_dtype=torch.float32, device=device,
                           delay_wgrad_compute=delay)
    else:
        module = te.GroupedLinear(EXPERTS, WIDTH, WIDTH, bias=True, params_dtype=torch.float32, device=device,
                                  delay_wgrad_compute=delay)
    for name, param in module.named_parameters():
        param.requires_grad_(not name.startswith("bias"))
    return module


def run(te, kind: str, delay: bool, fp8, device: str) -> tuple[bool, str]:
    """One forward/backward (and backward_dw when delayed); whether every frozen bias kept grad None."""
    torch.manual_seed(0)
    module = build(te, kind, delay, device)
    x = torch.randn(ROWS, WIDTH, device=device)
    region = te.autocast(enabled=True, recipe=fp8) if fp8 is not None else contextlib.nullcontext()
    with region:
        out = module(x) if kind == "Linear" else module(x, [ROWS // EXPERTS] * EXPERTS)
    out.backward(torch.randn_like(out))
    if delay:
        module.backward_dw()
    biases = [p for n, p in module.named_parameters() if n.startswith("bias")]
    with_grad = sum(b.grad is not None for b in biases)
    return with_grad == 0, f"{with_grad} of {len(biases)} frozen bias(es) got a gradient"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="boot TE's Python over te_verify's tex emulation (no GPU)")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    if args.cpu:
        from te_verify.te.tecpu import boot  # the only te_verify use: what stands in for the CUDA extension

        boot()
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    failures = 0
    for kind in ("Linear", "GroupedLinear"):
        for label, fp8 in (("high precision", None), ("FP8 delayed scaling", recipe.DelayedScaling())):
            for delay in (False, True):
                try:
                    ok, what = run(te, kind, delay, fp8, device)
                except Exception as exc:  # TE 2.14.0, FP8 + delayed wgrad: backward_dw raises on the absent bias grad
                    ok, what = False, f"raised {type(exc).__name__}: {exc}"
                failures += not ok
                print(f"{kind}, {label}, delay_wgrad_compute={delay}: {what}; {'OK' if ok else 'WRONG'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
