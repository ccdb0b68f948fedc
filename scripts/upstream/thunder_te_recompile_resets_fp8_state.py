"""Standalone reproducer for upstream (lightning-thunder's TE executor): unfreezing a parameter after the first
step makes thunder.jit recompile, and the new trace's TE operators get new state objects, so FP8 delayed scaling
restarts from scale 1 with an empty amax history: the first step after the change quantizes as the very first step
did, not with the scales the earlier steps produced.

    python thunder_te_recompile_resets_fp8_state.py         # on a CUDA machine with thunder and TransformerEngine
    python thunder_te_recompile_resets_fp8_state.py --cpu   # here: TE's Python over te_verify's tex emulation

Two jitted copies of one two-layer model run three identical steps (same input, no optimizer step, so only the FP8
state differs between calls) under te.autocast(DelayedScaling()): `kept` trains both layers throughout; `changed`
starts with layer 0 frozen and unfreezes it before step 2. Expected: layer 1's weight gradient at step 2 equals
`kept`'s step 2 (both run with the scales step 1 produced; TE's own modules keep their fp8_meta across such a change).
Seen with thunder 0.2.6: it equals step 1's bitwise (scale 1 again) and differs from `kept`'s step 2, because
StatefulExecutor keeps an operator's state "for as long as the trace lifetime" (thunder/extend/__init__.py) and
TERecipeState creates a RecipeState per trace (thunder/executors/transformer_engineex_impl.py).
"""
import argparse
import sys

import torch


def jitted_model(thunder, device: str, frozen_first: bool):
    from thunder.executors.transformer_engineex import TransformerEngineTransform, transformer_engine_ex

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)).to(device)
    for p in model[0].parameters():
        p.requires_grad_(not frozen_first)
    jitted = thunder.jit(model, executors=[transformer_engine_ex, *thunder.get_default_executors()],
                         transforms=[TransformerEngineTransform()])
    return model, jitted


def grads(te, recipe, thunder, device: str, frozen_first: bool) -> list[torch.Tensor]:
    """Layer 1's weight gradient at each of three steps; layer 0 unfrozen before step 2 where it starts frozen."""
    model, jitted = jitted_model(thunder, device, frozen_first)
    gen = torch.Generator().manual_seed(1)
    x, g = torch.randn(16, 32, generator=gen).to(device), torch.randn(16, 32, generator=gen).to(device) * 1e-3
    out = []
    for step in (1, 2, 3):
        if step == 2:
            for p in model[0].parameters():
                p.requires_grad_(True)
        with te.autocast(enabled=True, recipe=recipe):
            y = jitted(x)
        y.backward(g)
        out.append(model[1].weight.grad.clone())
        model.zero_grad(set_to_none=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="boot TE's Python over te_verify's tex emulation (no GPU)")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    if args.cpu:
        from te_verify.te.tecpu import boot  # what stands in for the CUDA extension

        boot()
    from te_verify.compat.thunder import import_thunder  # thunder 0.2.6 on torch 2.13; its TE checker on the CPU

    thunder = import_thunder()
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    kept = grads(te, recipe.DelayedScaling(), thunder, device, frozen_first=False)
    changed = grads(te, recipe.DelayedScaling(), thunder, device, frozen_first=True)
    restarted = torch.equal(changed[1], changed[0]) and not torch.equal(changed[1], kept[1])
    for step in (1, 2, 3):
        print(f"step {step}: layer 1 weight grad, changed vs kept: max abs diff "
              f"{(changed[step - 1] - kept[step - 1]).abs().max().item():.3g}")
    print(f"step 2 of the changed run equals its step 1 bitwise: {torch.equal(changed[1], changed[0])}; "
          f"{'RESTARTED (scale 1 again after the recompile)' if restarted else 'OK'}")
    return 1 if restarted else 0


if __name__ == "__main__":
    sys.exit(main())
