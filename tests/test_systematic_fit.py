"""The scale fit of checks.systematic on synthetic gradients: a known scale is recovered within its standard error; pure
rounding-like noise (relative, as a dtype's rounding is) passes over many draws; a 1% lean fails where the elements
resolve it, naming the gradient and the figures; too few elements, a zero or non-finite truth are never failed."""
from __future__ import annotations

import pytest
import torch

from te_verify.checks.systematic import MIN_ELEMENTS, RESOLUTION, Z, dispersion, fit_scale, grad_scale
from te_verify.checks.tolerances import TruthBound
from te_verify.record import Record

BF16_U = 2.0 ** -9


def noisy(truth: torch.Tensor, scale: float, rel_noise: float, seed: int) -> torch.Tensor:
    """scale x truth with an independent relative error of each element, uniform in +-rel_noise (a rounding's shape)."""
    gen = torch.Generator().manual_seed(10_000 + seed)  # a stream apart from truth_of's
    return scale * truth * (1 + rel_noise * (2 * torch.rand(truth.shape, generator=gen, dtype=torch.float64) - 1))


def truth_of(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def verdict(ref: torch.Tensor, got: torch.Tensor, truth: torch.Tensor, floor: float = BF16_U, name: str = "0.weight"):
    return verdicts({name: ref}, {name: got}, {name: truth}, floor)


def verdicts(ref: dict, got: dict, truth: dict, floor: float = BF16_U):
    records = [Record(backend=b, grads=[g]) for b, g in (("eager", ref), ("got", got), ("truth", truth))]
    return grad_scale("case", "got", records[0], records[1], TruthBound(records[2], 2.0, floor, "test"))


@pytest.mark.parametrize("scale", [0.97, 1.0, 1.01, 1.3])
def test_a_known_scale_is_recovered_within_its_standard_error(scale):
    truth = truth_of(4096)
    fit = fit_scale(noisy(truth, scale, BF16_U, seed=1), truth)
    assert abs(fit.scale - scale) < 4 * fit.stderr
    assert fit.stderr < 1e-4 and fit.elements == 4096 and 4096 / 4 < fit.effective < 4096


def test_the_standard_error_follows_the_noise_over_many_draws():
    """The sandwich estimate is the spread of s over independent draws of the same noise (within 15%)."""
    truth = truth_of(1024)
    fits = [fit_scale(noisy(truth, 1.0, BF16_U, seed), truth) for seed in range(400)]
    spread = torch.tensor([f.scale for f in fits]).std().item()
    estimate = sum(f.stderr for f in fits) / len(fits)
    assert 0.85 < estimate / spread < 1.15


@pytest.mark.parametrize("n", [MIN_ELEMENTS, 64, 1024, 16384])
def test_pure_rounding_noise_never_fails(n):
    truth = truth_of(n, seed=n)
    for seed in range(100):
        ref, got = noisy(truth, 1.0, BF16_U, 2 * seed), noisy(truth, 1.0, 4 * BF16_U, 2 * seed + 1)
        result = verdict(ref, got, truth)
        assert result.ok, result.message


def test_a_one_percent_lean_fails_naming_the_gradient_and_the_figures():
    truth = truth_of(4096)
    result = verdict(noisy(truth, 1.0, BF16_U, 1), noisy(truth, 1.01, BF16_U, 2), truth)
    assert not result.ok
    assert "grad of 0.weight leans 1.01" in result.message and "x its fp64 truth; eager 1.0000" in result.message
    assert f"({Z:g} standard errors, dispersion 1.00, over 4,096 elements)" in result.message
    assert result.problems and result.figures["grad_scale_share"] > 1 and result.figures["grad_scale_gradients"] == 1


def test_a_lean_within_eagers_own_passes():
    """Both runs share a lean (the same forward roundings): the backend is judged beyond eager's, not beyond 1."""
    truth = truth_of(4096)
    result = verdict(noisy(truth, 1.01, BF16_U, 1), noisy(truth, 1.01, BF16_U, 2), truth)
    assert result.ok, result.message


@pytest.mark.parametrize("n", [1, 4, MIN_ELEMENTS - 1])
def test_too_few_elements_cannot_fail_and_say_so(n):
    truth = truth_of(n)
    result = verdict(truth.clone(), 1.1 * truth, truth)
    assert result.ok and result.figures["grad_scale_gradients"] == 0
    assert result.figures["grad_scale_unresolved"] == 1 and result.figures["grad_scale_unresolved_names"] == "0.weight"


def test_one_dominant_element_counts_as_one():
    """Effective elements, not the count: 1,000 elements of which one carries the norm resolve nothing."""
    truth = torch.full((1000,), 1e-6, dtype=torch.float64)
    truth[0] = 1.0
    assert fit_scale(truth, truth).effective < 1.01
    assert verdict(truth.clone(), 1.1 * truth, truth).ok


def test_a_noisy_gradient_judged_but_unable_to_resolve_a_one_percent_lean_says_so():
    truth = truth_of(64)
    result = verdict(noisy(truth, 1.0, 0.3, 1), noisy(truth, 1.0, 0.3, 2), truth)
    assert result.ok and result.figures["grad_scale_gradients"] == 1
    assert result.figures["grad_scale_unresolved"] == 1, f"allowance should exceed {RESOLUTION}"


def test_a_zero_truth_is_not_fitted_and_a_non_finite_backend_fails():
    zero = torch.zeros(64, dtype=torch.float64)
    assert fit_scale(zero, zero) is None
    assert verdict(zero, torch.ones(64, dtype=torch.float64), zero).figures["grad_scale_unresolved"] == 1
    truth = truth_of(64)
    bad = truth.clone()
    bad[3] = float("nan")
    result = verdict(truth.clone(), bad, truth)
    assert not result.ok and "grad of 0.weight: non-finite values where the truth is finite" in result.message


def leaning(truth: torch.Tensor, sigmas: float, seed: int) -> torch.Tensor:
    """Rounding-like noise plus a lean of `sigmas` of its own standard errors (a correlated rounding upstream)."""
    plain = noisy(truth, 1.0, BF16_U, seed)
    return plain * (1 + sigmas * fit_scale(plain, truth).stderr)


def test_the_dispersion_is_eagers_leans_in_standard_errors_never_under_one():
    truth = truth_of(1024)
    assert dispersion([fit_scale(noisy(truth, 1.0, BF16_U, s), truth) for s in range(8)]) < 1.5
    assert dispersion([fit_scale(truth, truth)]) == 1.0  # an exact reference: no standard error to divide by
    leans = [fit_scale(leaning(truth, 8.0 * (-1) ** s, s), truth) for s in range(8)]
    assert 7 < dispersion(leans) < 9


def test_leans_as_large_as_eagers_own_pass_and_a_one_percent_lean_still_fails():
    """Where eager's own gradients lean ~8 standard errors (correlated roundings, as in bf16 attention), a correct
    backend leaning 20 the other way passes; a 1% lean on top of a correct backend still fails, naming its gradient."""
    truths = {f"{k}.weight": truth_of(4096, seed=k) for k in range(6)}
    eager = {n: leaning(t, 8.0 * (-1) ** k, 2 * k) for k, (n, t) in enumerate(truths.items())}
    correct = {n: leaning(t, -20.0 * (-1) ** k, 2 * k + 1) for k, (n, t) in enumerate(truths.items())}
    clean = verdicts(eager, correct, truths)
    assert clean.ok and clean.figures["grad_scale_dispersion"] > 7, clean.message
    wrong = verdicts(eager, {**correct, "3.weight": 1.01 * correct["3.weight"]}, truths)
    assert not wrong.ok and wrong.problems == (wrong.problems[0],) and "grad of 3.weight leans" in wrong.message
