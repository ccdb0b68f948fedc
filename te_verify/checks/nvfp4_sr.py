"""NVFP4 stochastic rounding, judged by its contract at the tex boundary (probes.nvfp4_sr): no reference can draw
TE's random bits (Philox on a GPU, the emulation's own generator here), so each stochastic quantization is held to
what any correct draw gives.

Per quantization and copy (rowwise: the source; columnwise: its transpose, after the random Hadamard transform where
the quantizer has it), from the format's definition (te.reference.block, not the emulation's code):
- the per-tensor amax and every E4M3 block scale are exactly the format's;
- every element is one of the two E2M1 neighbours of its scaled value v (never further; the sign kept);
- unbiased: with p = the fractional position of |v| between its neighbours, an element rounds up with probability
  p (TE draws 8 random bits per element, so within 2^-8 of p, never above it). The sum of (up - p) over the
  elements strictly between two neighbours has mean in (-n/256, 0] and variance at most sum p(1 - p);
- stochastic, not to nearest: the count of elements rounded to the farther neighbour has mean sum min(p, 1 - p)
  (within n/256) and variance at most sum m(1 - m), m = min(p, 1 - p). Rounding to nearest gives 0.
Both sums must be within n/256 + SIGMAS standard deviations of their mean, per copy and over the run (a correct
draw falls outside with probability under 1e-8; always rounding down, or to nearest, is tens of sigmas off on a
512-element copy). A stochastic quantization in a forward call fails (the recipe rounds forward tensors to nearest),
and a case whose recipe sets stochastic rounding but made no such quantization is "not observed".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from te_verify.checks.verdict import Verdict, not_observed
from te_verify.probes.nvfp4_sr import StochasticQuantization, StoredCopy
from te_verify.te.reference import block

SIGMAS = 6.0  # the statistics' bound, in standard deviations
RANDOM_BITS = 8  # TE's random bits per element: P(up) is p rounded down to a multiple of 2^-8
BLOCK = 16  # NVFP4's elements per block scale


@dataclass
class Copy:
    """One stored copy against the format's definition."""

    # The scaled values v (fp32, stored orientation), their E2M1 neighbours and the stored element magnitudes.
    scaled: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    stored: torch.Tensor
    # Problems with the scales, the amax or the elements (empty when it keeps the format's rules).
    problems: list[str]

    def up(self) -> torch.Tensor:
        """Where the copy rounded an element to its upper neighbour (False on the grid and where saturated)."""
        return (self.stored.abs() == self.upper) & (self.upper > self.lower)


def _source(q: StochasticQuantization, columnwise: bool) -> torch.Tensor:
    if not columnwise:
        return q.source
    return block.hadamard(q.source.t()) if q.rht else q.source.t()


def judge_copy(q: StochasticQuantization, stored: StoredCopy, columnwise: bool) -> Copy:
    """The copy's scales, amax and elements against the format's definition."""
    x = _source(q, columnwise)
    amax = x.abs().float().nan_to_num(nan=0.0).max()
    scaled, s_b = block.nvfp4_scaled(x, amax, q.two_d)
    lower, upper = block.e2m1_neighbours(scaled)
    problems = []
    if stored.amax != float(amax):
        problems.append(f"amax {stored.amax} where the source's is {float(amax)}")
    want = s_b[:, ::BLOCK]
    bad = (stored.scales != want).nonzero()
    if len(bad):
        r, c = bad[0].tolist()
        problems.append(f"{len(bad)} block scales differ from the format's, first block ({r}, {c}): "
                        f"{float(stored.scales[r, c])} where it is {float(want[r, c])}")
    mag = stored.values.abs()
    sign_ok = (mag == 0) | (torch.signbit(stored.values) == torch.signbit(scaled))
    wrong = (((mag != lower) & (mag != upper)) | ~sign_ok) & torch.isfinite(scaled)
    if wrong.any():
        r, c = wrong.nonzero()[0].tolist()
        problems.append(f"{int(wrong.sum())} elements are not an E2M1 neighbour of their scaled value, first "
                        f"({r}, {c}): {float(stored.values[r, c])} for {float(scaled[r, c])} (neighbours "
                        f"{float(lower[r, c])}, {float(upper[r, c])})")
    return Copy(scaled, lower, upper, mag, problems)


@dataclass
class Moments:
    """The two statistics' sums over a set of elements strictly between two E2M1 neighbours."""

    # Elements counted; sum of (up - p) and its variance bound; far-neighbour count, its mean and variance bound.
    n: int = 0
    bias: float = 0.0
    bias_var: float = 0.0
    far: float = 0.0
    far_mean: float = 0.0
    far_var: float = 0.0

    def add(self, c: Copy) -> None:
        between = (c.upper > c.lower) & torch.isfinite(c.scaled)
        a = c.scaled.abs().double()[between]
        lo, hi = c.lower.double()[between], c.upper.double()[between]
        p = (a - lo) / (hi - lo)
        up = (c.stored.double()[between] == hi).double()
        m = torch.minimum(p, 1 - p)
        self.n += int(between.sum())
        self.bias += float((up - p).sum())
        self.bias_var += float((p * (1 - p)).sum())
        self.far += float(torch.where(p < 0.5, up, 1 - up).sum())
        self.far_mean += float(m.sum())
        self.far_var += float((m * (1 - m)).sum())

    def problems(self) -> list[str]:
        slack = self.n / 2 ** RANDOM_BITS
        out = []
        bias_bound = slack + SIGMAS * math.sqrt(self.bias_var)
        if abs(self.bias) > bias_bound:
            out.append(f"biased: sum of (rounded up - p) over {self.n} elements is {self.bias:.1f}, bound "
                       f"{bias_bound:.1f} ({SIGMAS:g} sigma + n/256)")
        far_bound = slack + SIGMAS * math.sqrt(self.far_var)
        if abs(self.far - self.far_mean) > far_bound:
            out.append(f"not stochastic: {self.far:.0f} of {self.n} elements rounded to the farther neighbour, "
                       f"expected {self.far_mean:.1f} +- {far_bound:.1f}")
        return out

    def sigmas(self) -> float:
        return abs(self.bias) / math.sqrt(self.bias_var) if self.bias_var else 0.0


def _label(k: int, q: StochasticQuantization, columnwise: bool) -> str:
    return (f"stochastic quantization {k} (iteration {q.iteration}, {q.phase}, source {tuple(q.source.shape)}, "
            f"{'columnwise' if columnwise else 'rowwise'} copy)")


def nvfp4_stochastic_rounding(case_id: str, backend: str, got, gradient_gemms: bool = True) -> Verdict:
    """Every stochastic NVFP4 quantization of the run against the contract (module doc). `gradient_gemms`: whether
    the case's oracle has a dgrad or wgrad GEMM; stochastic rounding applies to gradients, so without one a run that
    rounded nothing stochastically passes saying so (any stochastic quantization it did make is still judged)."""
    seen = got.observations.get("nvfp4_sr")
    if not gradient_gemms and not (seen and seen["stochastic"]):
        return Verdict("nvfp4_stochastic_rounding", True, figures={
            "nvfp4_sr_compared": "nothing: the case needs no gradient GEMM, so no gradient is rounded"})
    if seen is None or not seen["stochastic"]:
        why = ("the run reached no tex boundary" if seen is None
               else "the recipe rounds gradients stochastically, but no stochastic NVFP4 quantization was made")
        return not_observed("nvfp4_stochastic_rounding", case_id, backend, why, {"nvfp4_sr_quantizations": 0})
    problems, total, copies, elements = [], Moments(), 0, 0
    for k, q in enumerate(seen["stochastic"], start=1):
        if q.phase != "backward":
            problems.append(f"{_label(k, q, False)}: stochastic rounding in a forward call (the recipe rounds "
                            f"forward tensors to nearest)")
        for columnwise, stored in ((False, q.rowwise), (True, q.columnwise)):
            if stored is None:
                continue
            c = judge_copy(q, stored, columnwise)
            one = Moments()
            one.add(c)
            total.add(c)
            copies, elements = copies + 1, elements + c.stored.numel()
            problems += [f"{_label(k, q, columnwise)}: {p}" for p in c.problems + one.problems()]
    problems += [f"over the run: {p}" for p in total.problems()]
    figures = {"nvfp4_sr_quantizations": len(seen["stochastic"]), "nvfp4_sr_copies": copies,
               "nvfp4_sr_elements": elements, "nvfp4_sr_elements_between": total.n,
               "nvfp4_sr_bias_sigmas": round(total.sigmas(), 2),
               "nvfp4_sr_far": f"{total.far:.0f} (expected {total.far_mean:.1f})"}
    if problems:
        return Verdict("nvfp4_stochastic_rounding", False, f"[{case_id}] backend {backend}: " + "; ".join(problems[:5])
                       + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""), figures)
    return Verdict("nvfp4_stochastic_rounding", True, figures=figures)


@dataclass
class Choices:
    """What one stochastic quantization chose: the reference rounds its own values the same way (sr_replay)."""

    # The source (2-D, fp32) the run quantized.
    source: torch.Tensor
    # Where it rounded up: rowwise (the source's shape) and columnwise (the transpose's); None: no such copy.
    up_row: torch.Tensor | None
    up_col: torch.Tensor | None
    # Whether a reference quantization has replayed it.
    used: bool = field(default=False)


def rounding_choices(got) -> list[Choices]:
    """Every stochastic quantization's choices, in the run's order."""
    seen = got.observations.get("nvfp4_sr") or {"stochastic": []}
    return [Choices(q.source.float(), *(judge_copy(q, s, col).up() if s is not None else None
                                        for col, s in ((False, q.rowwise), (True, q.columnwise))))
            for q in seen["stochastic"]]
