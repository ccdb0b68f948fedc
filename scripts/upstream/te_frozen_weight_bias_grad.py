"""Standalone reproducer for upstream (TransformerEngine): te.Linear in high precision returns no bias gradient when
its weight is frozen and its bias trains (BitFit-style training). Uses TE's public API only.

    python te_frozen_weight_bias_grad.py            # on a CUDA machine with TransformerEngine installed
    python te_frozen_weight_bias_grad.py --cpu      # here: TE's Python over te_verify's tex emulation

Expected: bias.grad equals the sum of the output gradient over rows (as torch.nn.Linear's), with or without FP8.
Seen with TE 2.20.2's Python: bias.grad stays None in high precision (TE computes the bias gradient only inside the
wgrad GEMM, which it skips for a frozen weight: module/linear.py); under FP8 autocast it is right. te.GroupedLinear
behaves the same way.
"""
import argparse
import contextlib
import sys

import torch


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
    for label, fp8 in (("high precision", None), ("FP8 delayed scaling", recipe.DelayedScaling())):
        torch.manual_seed(0)
        linear = te.Linear(32, 32, bias=True, params_dtype=torch.float32, device=device)
        linear.weight.requires_grad_(False)  # frozen weight, trainable bias
        x = torch.randn(16, 32, device=device)
        grad_out = torch.randn(16, 32, device=device)
        region = te.autocast(enabled=True, recipe=fp8) if fp8 is not None else contextlib.nullcontext()
        with region:
            out = linear(x)
        out.backward(grad_out)
        want = grad_out.sum(0)
        got = linear.bias.grad
        ok = got is not None and torch.allclose(got, want, rtol=1e-5, atol=1e-5)
        failures += not ok
        print(f"{label}: bias.grad {'None' if got is None else 'present'}; {'OK' if ok else 'WRONG'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
