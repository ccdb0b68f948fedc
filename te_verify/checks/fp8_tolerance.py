"""The bound FP8 gradients are held to: accumulation noise, not quantization noise.

TE's FP8 Linear computes dgrad = Q(dy) x Q(W) and wgrad = Q(dy)^T x Q(x), each operand quantized with its own scale
(E4M3, or E5M2 for dy under HYBRID; delayed scaling's amax history or the tensor's own amax) and the products
accumulated in fp32. Against fp32 eager such gradients differ by the quantization itself (TE's own tests allow
rtol 0.125, atol 0.0675), which hides a wgrad 5% off. Against a reference that quantizes the same operands with the
same scales (te_case.output_reference: te_verify.te.reference's Linear carried through backward), only the order and
precision of the accumulation differ. So, as for every other gradient (checks.tolerances.truth_bound, after PyTorch's
SDPA tests and Higham ch. 3): the truth is that quantized reference in exact arithmetic (te_case.quantized_truth: the
same quantization, fp64 everywhere else), and a backend's normwise error against it may be at most TRUTH_FACTOR
times the fp32 quantized reference's, never under the floor.

The floor: a correct device sums in another order, compounded through the layers a gradient flows through. (TE's FP8
GEMM scales the fp32 sum of FP8 products by scale_inv_A x scale_inv_B, cuBLAS's alpha, and takes its scale as one fp32
division; the reference does both since 2026-11-29, branch fp8ac: before, it dequantized each operand first and took
448 / amax as a reciprocal times 448, a few more roundings the floor had to cover; the figures below are from then.)
FP8_FLOOR_ROUNDINGS unit roundoffs of the gradient's dtype (2^-20 in fp32) cover it with room: measured on the pr
tier's FP8 te_eager cases (TE 2.20.2 over the tex emulation), the worst normwise error against the truth is 3.6e-7 (a
LoRA Llama's norm weight, 0.2 of the bound); the reference with every forward GEMM summed in reverse order, over 124
nightly FP8 specs, reaches 0.3 of it. A wgrad 5% off is 5e-2 away.

Not covered: under torch.autocast (te_autocast) the GEMMs emit bf16, so a device summing in another order can flip
a bf16 rounding, and downstream an FP8 one, by more than the fp32 floor; TE over the tex emulation equals the
reference bit for bit there (tests/test_te_autocast.py), a GPU is unmeasured. Nor is a GPU whose FP8 forward GEMM
accumulates in reduced precision (TE's DelayedScaling and Float8CurrentScaling run fprop without the split
accumulator): it can round a downstream activation to the neighbouring FP8 value where the reference does not; the
wgrad that reads it then differs by up to a few percent (simulated with a 14-bit accumulator: 62 of the 93 FP8 specs
of the pr matrix). Such a device needs the reference fed the device's own quantized operands per layer.
"""
from __future__ import annotations

from te_verify.checks.tolerances import TRUTH_FACTOR, UNIT_ROUNDOFF, TruthBound
from te_verify.record import Record
from te_verify.spec import CaseSpec

FP8_FLOOR_ROUNDINGS = 16


def fp8_bound(spec: CaseSpec, truth: Record) -> TruthBound:
    """The bound of an FP8 case's gradients against `truth`, the quantized reference in fp64 (see the module doc)."""
    floor = FP8_FLOOR_ROUNDINGS * UNIT_ROUNDOFF[spec.dtype]
    return TruthBound(truth, TRUTH_FACTOR, floor,
                      f"normwise error vs the FP8-quantized reference in fp64 <= {TRUTH_FACTOR:g} x the fp32 quantized "
                      f"reference's, floor {floor:.3g} x |truth| (checks.fp8_tolerance)")
