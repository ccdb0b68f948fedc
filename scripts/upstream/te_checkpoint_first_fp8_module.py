"""Standalone reproducer for upstream (TransformerEngine): a backward through `te.distributed.checkpoint` leaves TE's
global FP8 state changed outside any autocast region: `FP8GlobalStateManager.quantization_state.is_first_fp8_module`
is True after the step where it was False before (high precision and FP8; reentrant and not). Uses TE's public API.

    python te_checkpoint_first_fp8_module.py            # on a CUDA machine with TransformerEngine installed
    python te_checkpoint_first_fp8_module.py --cpu      # here: TE's Python over te_verify's tex emulation (and its
                                                        # CPU RNG step for TE's checkpoint, compat.te_checkpoint_cpu)

Expected: the flag as the forward left it (False: the first FP8 module of the forward cleared it), as without the
checkpoint. Seen with TE 2.20.2's Python: True after backward. The recompute (distributed.py, _CheckpointFunction
.backward and the non-reentrant recompute_fn) re-enters `autocast(enabled=fp8, ...)` at depth 0, whose
`autocast_enter` sets is_first_fp8_module = True, and nothing clears it before the next forward's autocast entry
(which sets it again: harmless to TE's own flow, but state left behind for anything reading it between steps).
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
        from te_verify.te.tecpu import boot  # what stands in for the CUDA extension
        from te_verify.compat import te_checkpoint_cpu  # TE's checkpoint reads the CUDA RNG state

        boot()
        te_checkpoint_cpu.apply()
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager

    failures = 0
    for label, fp8 in (("high precision", None), ("FP8 delayed scaling", recipe.DelayedScaling())):
        for reentrant in (True, False):
            torch.manual_seed(0)
            layers = [te.Linear(32, 32, params_dtype=torch.float32, device=device) for _ in range(2)]
            x = torch.randn(16, 32, device=device, requires_grad=True)
            FP8GlobalStateManager.reset()
            with te.autocast(enabled=True, recipe=fp8) if fp8 else contextlib.nullcontext():
                y = te.distributed.checkpoint(lambda h: layers[1](layers[0](h)), x, use_reentrant=reentrant)
            before = FP8GlobalStateManager.quantization_state.is_first_fp8_module
            y.sum().backward()
            after = FP8GlobalStateManager.quantization_state.is_first_fp8_module
            ok = after == before
            failures += not ok
            print(f"{label}, use_reentrant={reentrant}: is_first_fp8_module {before} after forward, {after} after "
                  f"backward; {'OK' if ok else 'CHANGED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
