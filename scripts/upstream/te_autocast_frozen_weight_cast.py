"""Standalone reproducer for upstream (TransformerEngine): under torch.autocast(bf16), te.Linear keeps the bf16 cast of
a frozen weight for backward although no gradient reads it. Uses TE's and torch's public API only.

    python te_autocast_frozen_weight_cast.py            # on a CUDA machine with TransformerEngine installed
    python te_autocast_frozen_weight_cast.py --cpu      # here: TE's Python over te_verify's tex emulation

The layer: fp32 parameters, the weight frozen, the bias trainable, an input that needs no gradient (the first layer of
a model fine-tuned BitFit-style). Its backward computes the bias gradient only: no dgrad (the input needs none) and
no wgrad (the weight is frozen), so nothing needs the weight or its cast. Expected: no tensor of the weight's shape is
saved for backward (torch.nn.Linear under the same autocast saves none). Seen with TE 2.20.2's Python: the bf16 cast
of the weight ([out, in], 2 bytes an element) is saved (module/linear.py: `weightmat = cast_if_needed(weightmat,
activation_dtype)`, then `wt_save = weightmat` unconditionally); te_verify's te_saved_bytes names it.
"""
import argparse
import sys

import torch


def saved_weight_casts(layer: torch.nn.Module, x: torch.Tensor, device: str) -> list[tuple]:
    """(dtype, shape) of every tensor saved for backward that has the weight's shape and is no Parameter."""
    seen = []

    def pack(t: torch.Tensor):
        if tuple(t.shape) == tuple(layer.weight.shape) and not isinstance(t, torch.nn.Parameter):
            seen.append((t.dtype, tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(device, dtype=torch.bfloat16):
            out = layer(x)
    out.float().sum().backward()
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="boot TE's Python over te_verify's tex emulation (no GPU)")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    if args.cpu:
        from te_verify.te.tecpu import boot  # the only te_verify use: what stands in for the CUDA extension

        boot()
    import transformer_engine.pytorch as te

    failures = 0
    for label, layer in (("torch.nn.Linear", torch.nn.Linear(32, 64, device=device)),
                         ("te.Linear", te.Linear(32, 64, bias=True, params_dtype=torch.float32, device=device))):
        layer.weight.requires_grad_(False)  # frozen weight, trainable bias
        x = torch.randn(16, 32, device=device)  # needs no gradient
        seen = saved_weight_casts(layer, x, device)
        failures += bool(seen)
        print(f"{label}: saved for backward, of the frozen weight's shape: {seen or 'nothing'}; "
              f"{'WRONG' if seen else 'OK'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
