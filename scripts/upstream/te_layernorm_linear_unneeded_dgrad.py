"""Standalone reproducer for upstream (TransformerEngine): te.LayerNormLinear runs its dgrad GEMM and the layer-norm
backward, and keeps the norm's mean and 1/sigma for backward, also when neither its input nor its norm's parameters
need a gradient (a trained weight behind a frozen norm: LoRA/PEFT-style training of the first layer). Uses TE's public
API only.

    python te_layernorm_linear_unneeded_dgrad.py            # on a CUDA machine with TransformerEngine installed
    python te_layernorm_linear_unneeded_dgrad.py --cpu      # here: TE's Python over te_verify's tex emulation

Expected: with x.requires_grad False and layer_norm_weight/bias frozen, backward runs the wgrad GEMM only. Seen with
TE 2.20.2's Python: the dgrad GEMM (module/layernorm_linear.py "dgrad GEMM", unconditional) and tex.layernorm_bwd
run in every backward; their results are dropped. The script counts TE's tex calls and exits 1 while that holds.
"""
import argparse
import collections
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
    import transformer_engine_torch as tex

    calls: collections.Counter = collections.Counter()
    for name in ("generic_gemm", "layernorm_bwd"):
        original = getattr(tex, name)
        setattr(tex, name, lambda *a, _f=original, _n=name, **k: (calls.update([_n]), _f(*a, **k))[1])
    torch.manual_seed(0)
    module = te.LayerNormLinear(32, 32, bias=True, params_dtype=torch.float32, device=device)
    for p in (module.layer_norm_weight, module.layer_norm_bias, module.bias):
        p.requires_grad_(False)  # only the weight trains; the input needs no gradient
    x = torch.randn(16, 32, device=device)
    out = module(x)
    calls.clear()
    out.backward(torch.randn_like(out))
    gemms, norms = calls["generic_gemm"], calls["layernorm_bwd"]
    ok = gemms == 1 and norms == 0
    print(f"backward: {gemms} GEMM(s) (1 needed: wgrad), {norms} layernorm_bwd call(s) (0 needed); "
          f"{'OK' if ok else 'UNNEEDED WORK'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
