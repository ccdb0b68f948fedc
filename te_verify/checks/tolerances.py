"""Tolerances as data: a table per dtype and per FP8 recipe, with the source of every number.

Overrides are scoped (backend, dtype) entries with a comment saying why; there are none by default.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from te_verify.oracle.required import compute_dtype
from te_verify.record import Record
from te_verify.spec import CaseSpec


@dataclass(frozen=True)
class Tolerance:
    # Relative tolerance, as in torch.testing.assert_close.
    rtol: float
    # Absolute tolerance.
    atol: float
    # Where the numbers come from.
    source: str
    # A derived tolerance's atol of each later iteration, as (iteration, atol) pairs (derived_tolerance); the first
    # iteration and warm-up steps use `atol`.
    later_atols: tuple[tuple[int, float], ...] = ()

    def __str__(self) -> str:
        return f"rtol={self.rtol:g}, atol={self.atol:g}"

    def at(self, iteration: int) -> "Tolerance":
        """The tolerance of values of `iteration` (1-based)."""
        atol = dict(self.later_atols).get(iteration)
        return self if atol is None else Tolerance(self.rtol, atol, self.source)


DTYPE_TOLERANCES: dict[str, Tolerance] = {
    # torch/testing/_comparison.py _DTYPE_PRECISIONS[float32]; TE tests/pytorch/utils.py dtype_tols(fp32).
    "fp32": Tolerance(1.3e-6, 1e-5, "torch.testing _DTYPE_PRECISIONS float32 (= TE dtype_tols fp32)"),
    # torch/testing/_comparison.py _DTYPE_PRECISIONS[bfloat16]; TE tests/pytorch/utils.py dtype_tols(bf16).
    "bf16": Tolerance(1.6e-2, 1e-5, "torch.testing _DTYPE_PRECISIONS bfloat16 (= TE dtype_tols bf16)"),
}

RECIPE_TOLERANCES: dict[str, Tolerance] = {
    # TE tests/pytorch/utils.py quantization_tols: every FP8 recipe maps to E4M3 (rtol 0.125, atol 0.0675);
    # thunder's te_assert_close uses the same numbers for E4M3-only recipes.
    "delayed": Tolerance(0.125, 0.0675, "TE tests/pytorch/utils.py quantization_tols (E4M3)"),
    "current": Tolerance(0.125, 0.0675, "TE tests/pytorch/utils.py quantization_tols (E4M3)"),
    # Either recipe in Format.HYBRID (E5M2 gradients, 2 mantissa bits): thunder's te_assert_close uses these for
    # HYBRID/E5M2 recipes; TE tests/pytorch/utils.py dtype_tols(E5M2) gives the same numbers.
    "hybrid": Tolerance(0.25, 0.125, "thunder te_assert_close HYBRID/E5M2 (= TE dtype_tols E5M2)"),
    # The block-scaled FP8 recipes' elements are E4M3 too (MXFP8, FP8 block scaling; the custom factory's MXFP8).
    "mxfp8": Tolerance(0.125, 0.0675, "TE tests/pytorch/utils.py quantization_tols (E4M3)"),
    "block": Tolerance(0.125, 0.0675, "TE tests/pytorch/utils.py quantization_tols (E4M3)"),
    "custom": Tolerance(0.125, 0.0675, "TE tests/pytorch/utils.py quantization_tols (E4M3)"),
    # E2M1 (one mantissa bit) rounds a value by at most 1/5 of it (5 -> 4 or 6): E5M2's allowance, the smallest
    # entry above that.
    "nvfp4": Tolerance(0.25, 0.125, "E2M1 rounding (at most 1/5 relative): E5M2's allowance"),
    "nvfp4_rn": Tolerance(0.25, 0.125, "E2M1 rounding (at most 1/5 relative): E5M2's allowance"),
}

# (backend, dtype) -> Tolerance. Each entry needs a comment saying why the default does not apply.
OVERRIDES: dict[tuple[str, str], Tolerance] = {}


def tolerance_for(spec: CaseSpec, backend: str = "") -> Tolerance:
    """The tolerance a backend's gradients must meet against the fp32/dtype eager reference."""
    if spec.te is not None and spec.te.recipe is not None:
        return RECIPE_TOLERANCES["hybrid" if spec.te.fp8_format == "HYBRID" else spec.te.recipe]
    dtype = compute_dtype(spec)  # the precision the GEMMs ran in (bf16 under autocast), not the parameters'
    return OVERRIDES.get((backend, dtype), DTYPE_TOLERANCES[dtype])


# A model family's output and gradients pass through softmax attention and RMSNorm, whose sums a backend may
# reassociate (thunder decomposes scaled-dot-product attention where eager runs one fused kernel): two fp32
# runs then differ by about eager's own rounding error, which exceeds the fp32 table's atol on such models. As
# PyTorch's SDPA tests do (test_transformers.py get_tolerances), the atol is derived from eager's own deviation
# from an fp64 run of the same case, times a fudge factor; never below the dtype's table entry.
DERIVED_FUDGE = 2.0


def _deviation(pairs: list[tuple]) -> float:
    """The largest elementwise |a - b| over the pairs (host, fp64)."""
    return max((float((a.double().cpu() - b.double().cpu()).abs().max()) for a, b in pairs if a.numel()), default=0.0)


def _grad_pairs(mine: dict, true: dict) -> list[tuple]:
    return [(mine[n], true[n]) for n in true if true[n] is not None and mine.get(n) is not None]


def derived_tolerance(spec: CaseSpec, eager: Record, truth: Record) -> Tolerance:
    """The dtype's tolerance with atol raised to DERIVED_FUDGE x eager's largest deviation from `truth` (fp64) over
    the first iteration's outputs and backward passes (and warm-up steps); each later iteration gets its own atol the
    same way from its output and gradients (the truth follows eager's parameters, runner.Trainer, so an iteration's
    deviation is that iteration's rounding, which grows as training moves the parameters)."""
    base = DTYPE_TOLERANCES[compute_dtype(spec)]
    iterations = eager.output_iterations or [1] * len(eager.outputs)  # a record without them: one step
    first = [k for k, i in enumerate(iterations) if i <= 1]
    pairs = [(eager.outputs[k], truth.outputs[k]) for k in first if k < len(truth.outputs)]
    for mine, true in zip(eager.grads, truth.grads):
        pairs += _grad_pairs(mine, true)
    deviation = _deviation(pairs)
    later = []
    for mine, true in zip(eager.steps[1:], truth.steps[1:]):
        outputs = [(o, t) for o, t, i in zip(eager.outputs, truth.outputs, iterations) if i == mine.iteration]
        later.append((mine.iteration, max(base.atol, DERIVED_FUDGE * _deviation(outputs + _grad_pairs(mine.grads, true.grads)))))
    atol = max(base.atol, DERIVED_FUDGE * deviation)
    return Tolerance(base.rtol, atol, f"{compute_dtype(spec)} table rtol; atol {DERIVED_FUDGE:g} x eager's max deviation "
                                      f"{deviation:.2e} from fp64, each iteration's own (PyTorch SDPA tests' "
                                      f"get_tolerances)", tuple(later))


# Every gradient and output of a torch-lane stack case is bounded by the case's own fp64 truth
# (runner.run_fp64_eager), not by a distance to eager: a backend's normwise error against the truth may be at most
# TRUTH_FACTOR times eager's own (never under FLOOR_ROUNDINGS unit roundoffs of the truth's norm). This is how
# PyTorch's SDPA tests bound a fused kernel (test_transformers.py: the low-precision result's error against an fp64
# reference, within a fudge factor of the math reference's error) and the normwise error measure of Higham's "Accuracy
# and Stability of Numerical Algorithms" (ch. 3): a correct kernel that accumulates in another order lands about as
# far from the truth as eager does, while a gradient 1% off is 1% away, far above bf16's 2^-9 roundoff. Elementwise
# tables cannot tell these apart in bf16: one element of two correct bf16 results differs by 6% (0.0688 vs 0.0645).
# Measured on every bf16 stack spec of the nightly tier (tests/test_tolerances.py keeps it): matmul-then-bias lands at
# most 1.42x eager's distance from the truth, a gradient 1% off at least 2.77x; fp32 separates by orders of magnitude.
# Model families keep derived_tolerance: in bf16 thunder's decomposed attention rounds its intermediates where eager's
# fused kernel keeps fp32, and a rank-1 LoRA gradient then lands 2.4x eager's normwise distance (a drawn nightly
# spec).
TRUTH_FACTOR = 2.0
UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "bf16": 2.0 ** -9}
# The floor, in unit roundoffs per dtype: where eager's own error stops being a scale. A gradient of a stack is the
# end of a chain of dependent roundings (a forward GEMM per layer, a dgrad per layer after it, the wgrad), and a
# correct kernel that associates the chain otherwise lands anywhere within a few roundings of the truth (Higham's
# gamma_n), while eager may land closer by luck: on a nightly case of width-1 layers eager's 0.weight gradient was
# 0.68 u from the truth and inductor's fused kernel 2.4 u. fp32 allows 8 roundings (a 4-layer stack's chain), still
# 2e4 times below a 1% error; bf16 keeps its one, since 8 of them would reach a planted 1% error.
FLOOR_ROUNDINGS = {"fp32": 8, "bf16": 1}
# Where the chain cancels, a count of roundings is not enough: any correct order lands tens or hundreds of them away.
# On a drawn 6-layer chain eager's 0.weight gradient was 0.7 u from the truth, thunder's 21 u, and 40 permuted orders
# 0.7 to 157 u (median 38): a few discrete outcomes of one cancelling sum, amplified, so the spread's tail is long.
# So an fp32 stack case also runs in ORDERS other summation orders (run.summation_orders), and each tensor's floor is
# at least ORDER_MARGIN times the largest of their distances: with TRUTH_FACTOR, 4 times the worst of eager and eight
# other orders. On that chain 40 further orders all pass (three orders failed 5 of 20); a gradient 1e-4 off still
# fails there (tests/test_tolerances.py). scripts/measure_summation_orders.py measures the widening over a tier.
ORDER_MARGIN = 2.0


@dataclass(frozen=True)
class TruthBound:
    # The fp64 run of the same case (same weights, inputs, passes): what every tensor is measured against.
    truth: Record
    # A backend may be this many times further from the truth than eager is (normwise).
    factor: float
    # The smallest error allowed, relative to the truth's norm: FLOOR_ROUNDINGS of the dtype's unit roundoff.
    floor: float
    # Where the numbers come from.
    source: str
    # Per tensor of `truth` (by identity): ORDER_MARGIN times the largest relative distance of the case's other
    # summation orders from it; empty where the case ran none (bf16, FP8, the distributed lane).
    spread: dict[int, float] = field(default_factory=dict, compare=False)

    def floor_of(self, truth: torch.Tensor) -> float:
        """The relative floor of `truth`'s comparisons: the dtype's, or its other orders' spread where larger."""
        return max(self.floor, self.spread.get(id(truth), 0.0))


def _tensors(record: Record) -> dict[tuple, torch.Tensor]:
    """Every tensor of `record` a truth comparison reads, keyed by where it is (two records of one case share keys)."""
    found = {("output", k): t for k, t in enumerate(record.outputs)}
    for k, grads in enumerate(record.grads):
        found.update({("grad", k, name): t for name, t in grads.items()})
    for k, step in enumerate(record.steps):
        found.update({("step grad", k, name): t for name, t in step.grads.items()})
        found.update({("step param", k, name): t for name, t in step.params.items()})
    return {key: t for key, t in found.items() if t is not None}


def _relative_distance(got: torch.Tensor, truth: torch.Tensor) -> float:
    if got.shape != truth.shape:
        return 0.0
    true64 = truth.detach().double().cpu()
    scale = float(true64.norm())
    return float((got.detach().double().cpu() - true64).norm()) / scale if scale else 0.0


def _spread(truth: Record, orders: tuple[Record, ...]) -> dict[int, float]:
    """ORDER_MARGIN x the largest relative distance of `orders` from each tensor of `truth`, keyed by its identity."""
    spread: dict[int, float] = {}
    for order in orders:
        theirs = _tensors(order)
        for key, true in _tensors(truth).items():
            if key in theirs:
                spread[id(true)] = max(spread.get(id(true), 0.0), ORDER_MARGIN * _relative_distance(theirs[key], true))
    return spread


def truth_bound(spec: CaseSpec, truth: Record, orders: tuple[Record, ...] = ()) -> TruthBound:
    """The bound of a case against its fp64 truth (see TRUTH_FACTOR), widened per tensor by the spread of the case's
    other summation orders (`orders`: run.summation_orders; see ORDER_MARGIN)."""
    dtype = compute_dtype(spec)  # under autocast the GEMMs round in bf16 whatever the parameters' dtype
    floor = FLOOR_ROUNDINGS[dtype] * UNIT_ROUNDOFF[dtype]
    widened = f", or {ORDER_MARGIN:g} x the worst of {len(orders)} other summation orders" if orders else ""
    return TruthBound(truth, TRUTH_FACTOR, floor, f"normwise error vs fp64 <= {TRUTH_FACTOR:g} x eager's, floor "
                                                  f"{floor:.3g} x |truth|{widened} (PyTorch SDPA tests; Higham ch. 3)",
                      _spread(truth, orders) if orders else {})
