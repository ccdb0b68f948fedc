"""Standalone reproducer for upstream (lightning-thunder): under torch.autocast(bf16) with an FP8 recipe, thunder's TE
executor quantizes the bf16 casts of an fp32 layer's input and weight, where TE's own modules quantize the fp32
tensors. Uses thunder's, TE's and torch's public API only.

    python thunder_te_autocast_quantizes_bf16_casts.py          # on a CUDA machine with thunder and TE installed
    python thunder_te_autocast_quantizes_bf16_casts.py --cpu    # here: TE's Python over te_verify's tex emulation

The layer: torch.nn.Linear(64, 128, bias=False), fp32 parameters (the master weights), an fp32 input, the forward
under torch.autocast(bfloat16) and te.autocast(DelayedScaling()) as users train. te.Linear with the same weight
quantizes the fp32 input and weight to FP8 (one rounding each) and emits bf16. thunder.jit with transformer_engine_ex
first applies thunder's autocast rule for linear (thunder/transforms/autocast.py: every operand cast to bf16), and the
executor then claims the bf16 linear: TE quantizes the casts, a second rounding (fp32 -> bf16 -> FP8), and the amax
that delayed scaling records is the cast's. Expected: thunder's output and weight gradient equal te.Linear's on the
same fp32 operands. Seen with thunder 0.2.6 and TE 2.20.2's Python: they differ (weight gradient about 1% normwise
here), and equal, bit for bit, te.Linear's on operands rounded to bf16 beforehand.
"""
import argparse
import sys

import torch


def thunder_run(thunder, te, recipe, weight, x, device):
    """thunder.jit(torch.nn.Linear) with thunder's TE executor: output, weight gradient, the TE forward's operand
    dtypes as the trace records them."""
    from thunder.executors.transformer_engineex import TransformerEngineTransform, transformer_engine_ex

    layer = torch.nn.Linear(64, 128, bias=False, device=device)
    with torch.no_grad():
        layer.weight.copy_(weight)
    jitted = thunder.jit(layer, executors=[transformer_engine_ex, *thunder.get_default_executors()],
                         transforms=[TransformerEngineTransform()])
    with torch.autocast(device, dtype=torch.bfloat16), te.autocast(enabled=True, recipe=recipe()):
        out = jitted(x)
    out.float().sum().backward()
    dtypes = [str(a.dtype) for b in thunder.last_traces(jitted)[-1].bound_symbols
              if b.sym.name == "te_functional_linear_fwd" for a in b.flat_args if hasattr(a, "dtype")]
    return out, layer.weight.grad, dtypes


def te_run(te, recipe, weight, x, device):
    """te.Linear on the same operands: output and weight gradient."""
    layer = te.Linear(64, 128, bias=False, params_dtype=torch.float32, device=device)
    with torch.no_grad():
        layer.weight.copy_(weight)
    with torch.autocast(device, dtype=torch.bfloat16), te.autocast(enabled=True, recipe=recipe()):
        out = layer(x)
    out.float().sum().backward()
    return out, layer.weight.grad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="boot TE's Python over te_verify's tex emulation (no GPU)")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    if args.cpu:  # the only te_verify use: what stands in for the CUDA extension, and thunder's CPU device check
        from te_verify.compat.thunder import import_thunder
        from te_verify.te.tecpu import boot

        boot()
        thunder = import_thunder()
    else:
        import thunder
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling

    torch.manual_seed(0)
    weight, x = torch.randn(128, 64, device=device) * 0.1, torch.randn(16, 64, device=device)
    out, grad, dtypes = thunder_run(thunder, te, DelayedScaling, weight, x, device)
    te_out, te_grad = te_run(te, DelayedScaling, weight, x, device)
    cast_out, cast_grad = te_run(te, DelayedScaling, weight.bfloat16().float(), x.bfloat16().float(), device)
    off = float((grad - te_grad).norm() / te_grad.norm())
    print(f"thunder's TE forward reads operands of dtypes {dtypes}")
    print(f"thunder vs te.Linear, same fp32 operands: output equal {torch.equal(out, te_out)}, weight gradient "
          f"{off:.3g} off normwise")
    print(f"thunder vs te.Linear on operands rounded to bf16 first: output equal {torch.equal(out, cast_out)}, "
          f"weight gradient equal {torch.equal(grad, cast_grad)}")
    wrong = not (torch.equal(out, te_out) and torch.equal(grad, te_grad))
    print("WRONG: thunder quantizes the bf16 casts" if wrong else "OK")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
