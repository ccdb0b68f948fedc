"""Standalone reproducer for upstream (TransformerEngine): te.LayerNormMLP runs its FC1 dgrad GEMM and the layer-norm
backward, and keeps the norm's mean and 1/sigma for backward, also when neither its input nor its norm's parameters
need a gradient (trained fc1/fc2 weights behind a frozen norm: PEFT-style training of a first MLP). Uses TE's public
API only.

    python te_layernorm_mlp_unneeded_dgrad.py            # on a CUDA machine with TransformerEngine installed
    python te_layernorm_mlp_unneeded_dgrad.py --cpu      # here: TE's Python over te_verify's tex emulation

Expected: with x.requires_grad False and layer_norm_weight/bias frozen, backward runs three GEMMs (FC2 dgrad, which
FC1's wgrad needs, and the two wgrads). Seen with TE 2.20.2's Python: the FC1 dgrad GEMM (module/layernorm_mlp.py
"FC1 DGRAD", unconditional) and tex.layernorm_bwd run in every backward; their results are dropped
(`dgrad if ctx.requires_dgrad else None`). The script counts TE's tex calls and exits 1 while that holds.
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
    module = te.LayerNormMLP(32, 64, bias=True, params_dtype=torch.float32, device=device)  # TE's default gelu
    for p in (module.layer_norm_weight, module.layer_norm_bias, module.fc1_bias, module.fc2_bias):
        p.requires_grad_(False)  # only fc1's and fc2's weights train; the input needs no gradient
    x = torch.randn(16, 32, device=device)
    out = module(x)
    calls.clear()
    out.backward(torch.randn_like(out))
    gemms, norms = calls["generic_gemm"], calls["layernorm_bwd"]
    ok = gemms == 3 and norms == 0
    print(f"backward: {gemms} GEMM(s) (3 needed: FC2 dgrad and wgrad, FC1 wgrad), {norms} layernorm_bwd call(s) "
          f"(0 needed); {'OK' if ok else 'UNNEEDED WORK'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
