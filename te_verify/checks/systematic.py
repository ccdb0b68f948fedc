"""Systematic error (`grad_scale`): each gradient's scale against its fp64 truth, fitted by least squares.

The normwise bound (checks.tolerances.truth_bound) and the elementwise one (derived_tolerance) allow each element
about a rounding of its dtype, so a gradient whose every element leans the same way by less than that can pass: in
bf16 a model family's elementwise bound lets a weight gradient 1% too large through. Over n elements a common lean
is a regression coefficient, and its noise shrinks as 1/sqrt(n).

The fit. With g the backend's gradient and t the truth (the case's fp64 run; for FP8, the same-quantization
reference in fp64), the scale that best maps the truth onto the gradient is s = <g, t> / <t, t> (least squares
through the origin). Write g = (1 + b) t + e, with b a lean and e the rounding error: s - 1 = b + <e, t> / <t, t>.
For independent zero-mean errors of variance v_i, Var(s) = sum t_i^2 v_i / (sum t_i^2)^2. Rounding errors are
relative (v_i grows with |t_i|), so the textbook standard error ||r|| / (||t|| sqrt(n - 1)), which assumes one
variance for all, is wrong here; the heteroscedasticity-consistent ("sandwich") estimate puts each squared residual
r_i = g_i - s t_i in place of v_i (White 1980; HC1 of MacKinnon & White 1985, the small-sample factor n / (n - 1)):
sigma^2 = n / (n - 1) * sum t_i^2 r_i^2 / (sum t_i^2)^2, n the effective number of elements carrying the fit,
(sum t^2)^2 / sum t^4 (all of them where the magnitudes are equal, 1 where one element dominates).

Correlated roundings. A gradient's errors are not independent: one rounding of an upstream value (a norm's
reciprocal, an attention row's softmax) scales a whole block of it, so s moves further than sigma says. Measured in
bf16 Llama blocks: eager's own gradients lean up to 11 sigma from their truth, thunder's decomposed attention 0.9%
one way where eager's fused kernel leans 0.25% the other (attn.k.weight of a 2-block nightly spec). How much further
is read from the reference itself, as quasi-likelihood reads a dispersion from the data (Wedderburn 1974; McCullagh &
Nelder, "Generalized Linear Models", 2nd ed., section 9.2): phi = the root mean square of (s_e - 1) / sigma_e over
the case's gradients, never under 1 (measured medians: 1.4 for linear stacks, 2.5 for Llama blocks, at most 8; about
40 for FP8's fp32 quantized reference, whose allowance the floor sets).

The bound. Eager's lean is a sample of the same noise, and what both runs share (the same forward roundings of the
same values) leans both alike, so the backend's lean may exceed eager's by Z standard errors of each, dispersed:

    |s - 1| <= max(|s_e - 1| + Z * phi * (sigma + sigma_e), floor)

with the floor of the normwise bound (TruthBound.floor_of: one rounding in bf16, eight in fp32, sixteen in FP8, or
the spread of the case's other summation orders where an fp32 case ran them; |s - 1| <= ||g - t|| / ||t||), a lean
it already accepts as a correct result's (TE's FP8 GEMM scales a whole output by one rounded product of scale
inverses). Z = 6, measured (docs/tolerances.md): over 3,551 gradient fits of correct backends (thunder,
torch.compile, another accumulation order, fp64 inside; te_eager, thunder_te) in the pr tier and the nightly bf16
specs, the worst lean is 0.49 of its allowance (without phi it is 1.26: Z would need 10 and leave a margin of 1.1).

What it cannot see: a gradient with fewer than MIN_ELEMENTS effective elements is not judged (its residuals cannot
estimate a noise level), and one whose allowance exceeds RESOLUTION cannot tell a 1% lean from noise; both are
counted (`grad_scale_unresolved`, named in `grad_scale_unresolved_names`), never failed. In bf16 Llama blocks the
allowance is often above 1%: there correct implementations themselves lean apart by about 1%. Element errors that
cancel (half the elements 1% high, half 1% low) do not lean; they are the normwise bound's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from te_verify.checks.ending import passes_compared
from te_verify.checks.parity import compared_nothing, host64
from te_verify.checks.tolerances import TruthBound
from te_verify.checks.verdict import Verdict
from te_verify.record import Record

Z = 6.0
MIN_ELEMENTS = 16
RESOLUTION = 0.01
# Standard errors below this are the fp64 fit's own roundings (a reference equal to its truth), not a noise level.
FIT_RESOLUTION = 1e-10


@dataclass(frozen=True)
class ScaleFit:
    # s = <g, t> / <t, t>: the factor that best maps the truth onto the gradient.
    scale: float
    # Its standard error, from the residuals (HC1 sandwich; see the module doc).
    stderr: float
    # How many elements were fitted.
    elements: int
    # How many of them carry the fit: (sum t^2)^2 / sum t^4 (all where the magnitudes are equal, 1 where one dominates).
    effective: float

    @property
    def lean(self) -> float:
        return abs(self.scale - 1.0)


def fit_scale(grad: torch.Tensor, truth: torch.Tensor) -> ScaleFit | None:
    """The least-squares scale of `grad` against `truth` and its standard error; None where the truth is all zero.
    Sums of elementwise products, not BLAS dot products: MKL's threaded ddot costs milliseconds on a busy machine."""
    g, t = host64(grad).flatten(), host64(truth).flatten()
    t2 = t * t
    tt = float(t2.sum())
    if tt == 0.0:
        return None
    scale = float((g * t).sum()) / tt
    weighted = t * (g - scale * t)  # t_i r_i
    effective = tt * tt / float((t2 * t2).sum())
    small_sample = effective / (effective - 1.0) if effective > 1.0 else math.inf
    return ScaleFit(scale, math.sqrt(small_sample * float((weighted * weighted).sum())) / tt, t.numel(), effective)


@dataclass(frozen=True)
class Pair:
    # What the gradient is of: a parameter's qualified name, or record.INPUT_GRAD.
    name: str
    # The backend's fit and eager's (for FP8, the fp32 quantized reference's).
    got: ScaleFit
    ref: ScaleFit

    def allowed(self, floor: float, dispersion: float) -> float:
        """The largest |s - 1| the backend may have (the module doc's bound)."""
        return max(self.ref.lean + Z * dispersion * (self.got.stderr + self.ref.stderr), floor)

    def case_resolves(self, floor: float, dispersion: float) -> bool:
        """Whether the case tells a RESOLUTION lean from noise in a backend as noisy as the reference: the allowance
        with the reference's standard error in both roles (a property of the case's size, not of the backend)."""
        return max(self.ref.lean + 2 * Z * dispersion * self.ref.stderr, floor) <= RESOLUTION


def fit_pair(name: str, ref: torch.Tensor, got: torch.Tensor, truth: torch.Tensor) -> Pair | str | None:
    """Both fits of one gradient; a problem message where the backend is non-finite and the truth and eager are not;
    None where there is nothing to fit (shape mismatch, a non-finite or zero truth, a non-finite eager)."""
    if not (ref.shape == got.shape == truth.shape) or not torch.isfinite(truth).all() or not torch.isfinite(ref).all():
        return None
    if not torch.isfinite(got).all():
        return f"grad of {name}: non-finite values where the truth is finite"
    mine, eager = fit_scale(got, truth), fit_scale(ref, truth)
    return None if mine is None or eager is None else Pair(name, mine, eager)


def dispersion(refs: list[ScaleFit]) -> float:
    """How far the reference's own leans exceed their standard errors, over the case's gradients: the root mean square
    of (s_e - 1) / sigma_e, never under 1 (the module doc's phi)."""
    terms = [((f.scale - 1.0) / f.stderr) ** 2 for f in refs if f.stderr > FIT_RESOLUTION]
    return max(1.0, math.sqrt(sum(terms) / len(terms))) if terms else 1.0


@dataclass(frozen=True)
class Lean:
    # The gradient's two fits.
    pair: Pair
    # The largest |s - 1| the backend may have.
    allowed: float

    @property
    def ratio(self) -> float:
        """|s - 1| over what is allowed: above 1 fails."""
        return self.pair.got.lean / self.allowed if self.allowed else math.inf


def _digits(allowed: float) -> int:
    """Decimals that show a scale to a tenth of the allowance."""
    return max(4, min(12, 1 - math.floor(math.log10(allowed)))) if allowed > 0 else 4


def lean_problem(lean: Lean, ref_name: str, phi: float) -> str:
    d, pair = _digits(lean.allowed), lean.pair
    return (f"grad of {pair.name} leans {pair.got.scale:.{d}f} x its fp64 truth; {ref_name} {pair.ref.scale:.{d}f}; "
            f"allowed 1 ± {lean.allowed:.2g} ({Z:g} standard errors, dispersion {phi:.2f}, over {pair.got.elements:,} "
            f"elements)")


def _names(names: list[str]) -> str:
    return ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")


def _figures(leans: list[Lean], unresolved: list[str], unsized: list[str], both: int, phi: float) -> dict:
    figures = {"grad_scale_gradients": len(leans), "grad_scale_elements": sum(x.pair.got.elements for x in leans),
               "grad_scale_unresolved": len(unresolved), "grad_scale_passes": both,
               "grad_scale_dispersion": round(phi, 2), "grad_scale_case_unresolved": len(unsized)}
    if unresolved:
        figures["grad_scale_unresolved_names"] = _names(unresolved)
    if unsized:
        figures["grad_scale_case_unresolved_names"] = _names(unsized)
    if leans:
        worst = max(leans, key=lambda x: x.ratio)
        d = _digits(worst.allowed)
        figures.update(grad_scale_share=round(worst.ratio, 4),
                       grad_scale_worst=f"{worst.pair.name}: {worst.pair.got.scale:.{d}f} (reference "
                                        f"{worst.pair.ref.scale:.{d}f}, allowed 1 ± {worst.allowed:.2g})")
    return figures


def _pairs(ref: dict, got: dict, truths: dict) -> tuple[list[Pair], list[str], list[str]]:
    """(fitted pairs with enough elements, names not judged, non-finite problems) over the gradients present in all
    three (None-ness is the presence check's)."""
    pairs, unresolved, problems = [], [], []
    for name, ref_grad in ref.items():
        got_grad, truth = got.get(name), truths.get(name)
        if ref_grad is None or got_grad is None or truth is None:
            continue
        pair = fit_pair(name, ref_grad, got_grad, truth)
        if isinstance(pair, str):
            problems.append(pair)
        elif pair is None or pair.got.effective < MIN_ELEMENTS:
            unresolved.append(name)  # nothing to fit, or too few elements to estimate the noise: not judged
        else:
            pairs.append(pair)
    return pairs, unresolved, problems


def _groups(ref: Record, got: Record, truth: Record, index: int, later: bool) -> list[tuple[str, dict, dict, dict]]:
    """(label, ref grads, got grads, truth grads) of backward pass `index` of the first iteration and, with `later`,
    of every later iteration all three completed."""
    first = "iteration 1:" if later and len(ref.steps) > 1 else ""
    groups = [(first, ref.grads[index], got.grads[index], truth.grads[index])]
    if later:
        for k in range(1, min(len(ref.steps), len(got.steps), len(truth.steps))):
            step = ref.steps[k]
            groups.append((f"iteration {step.iteration}:", step.grads, got.steps[k].grads, truth.steps[k].grads))
    return groups


def grad_scale(case_id: str, backend: str, ref: Record, got: Record, bound: TruthBound, pass_index: int = -1,
               label: str = "") -> Verdict:
    """Every gradient present in both runs and the truth, after backward pass `pass_index` of the first iteration
    (default: the last one both completed, and then every later iteration too), leans from its truth no further than
    eager's does plus Z standard errors of each, scaled by the dispersion of eager's own leans in that iteration
    (module doc). `label` names the check's point in the failure text."""
    nothing = compared_nothing("grad_scale", case_id, backend, ref, got)
    if nothing is not None:
        return nothing
    both = passes_compared(ref, got)
    index = both - 1 if pass_index == -1 else pass_index
    if index >= len(bound.truth.grads):
        return Verdict("grad_scale", False, f"[{case_id}] backend {backend}: no fp64 truth for backward pass "
                                            f"{index + 1} (it completed {len(bound.truth.grads)}): nothing to fit")
    leans, unresolved, unsized, problems, phis = [], [], [], [], []
    for where, ref_grads, got_grads, truths in _groups(ref, got, bound.truth, index, pass_index == -1):
        pairs, unfit, found = _pairs(ref_grads, got_grads, truths)
        phi = dispersion([p.ref for p in pairs])
        floors = {p.name: bound.floor_of(truths[p.name]) for p in pairs}  # a lean is at most the normwise error
        group = [Lean(p, p.allowed(floors[p.name], phi)) for p in pairs]
        small = unfit + [p.name for p in pairs if not p.case_resolves(floors[p.name], phi)]  # the case's size
        unfit += [x.pair.name for x in group if x.allowed > RESOLUTION]  # judged, but a 1% lean would pass as noise
        found += [lean_problem(x, ref.backend, phi) for x in group if x.ratio > 1.0]
        leans, phis = leans + group, phis + [phi]
        unresolved += [f"{where} {n}".strip() for n in unfit]
        unsized += [f"{where} {n}".strip() for n in small]
        problems += [f"{label} {where} {p}".strip() for p in found]
    figures = _figures(leans, unresolved, unsized, both, max(phis))
    figures["grad_scale_iterations_compared"] = len(phis)
    if not problems:
        return Verdict("grad_scale", True, figures=figures)
    at = f" at backward pass {index + 1}" if both > 1 else ""
    head = f"[{case_id}] backend {backend}: {label + ' ' if label else ''}gradient scale vs the truth failed{at}"
    return Verdict("grad_scale", False, "; ".join([head, *problems]), figures, tuple(problems))


def resolution(case_id: str, backend: str, scale: Verdict) -> Verdict:
    """`grad_scale_resolution`, for cases sized to resolve a 1% lean (the TE lane's high-precision bf16 cases,
    docs/tolerances.md, "What a bf16 case must hold"): every gradient grad_scale (`scale`, its verdict) fitted has
    MIN_ELEMENTS effective elements and, with the reference's noise in both roles, an allowance of at most RESOLUTION
    (Pair.case_resolves: the case's size, whatever the backend's own noise). An undersized case fails naming what it
    cannot resolve, where grad_scale alone would count it and pass a 1% lean as noise; a fit of nothing is not
    observed."""
    figures = scale.figures
    judged, unsized = figures.get("grad_scale_gradients", 0), figures.get("grad_scale_case_unresolved", 0)
    head = f"[{case_id}] backend {backend}: grad_scale"
    if not judged:
        return Verdict("grad_scale_resolution", False, f"{head} fitted no gradient: resolution not observed")
    if unsized:
        return Verdict("grad_scale_resolution", False,
                       f"{head} cannot tell a {RESOLUTION:.0%} lean from noise in {unsized} of its gradients "
                       f"({figures.get('grad_scale_case_unresolved_names', '')}): the case is too small to resolve it")
    return Verdict("grad_scale_resolution", True, figures={"grad_scale_resolved": judged})
