"""Gradient parity: a backend's gradients equal the reference's, parameter by parameter."""
from __future__ import annotations

import torch

from te_verify.checks.ending import passes_compared, steps_compared
from te_verify.checks.tolerances import Tolerance, TruthBound
from te_verify.checks.verdict import Verdict, not_observed
from te_verify.record import Record


def host64(t: torch.Tensor) -> torch.Tensor:
    """`t` on the host in fp64: the reference and a distributed rank's gradients come from different devices."""
    return t.detach().to(device="cpu", dtype=torch.float64)


def max_errors(ref: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
    """Max absolute error and max relative error (relative to |ref|, where ref is non-zero), in fp64."""
    ref64, got64 = host64(ref), host64(got)
    abs_err = (got64 - ref64).abs()
    rel_err = abs_err / ref64.abs().clamp_min(torch.finfo(torch.float64).tiny)
    if abs_err.numel() == 0:
        return 0.0, 0.0
    return float(abs_err.max()), float(rel_err.max())


def compare_tensor(what: str, ref: torch.Tensor, got: torch.Tensor, tol: Tolerance) -> str | None:
    """None when `got` matches `ref` within `tol` (assert_close's rule); otherwise a message naming `what`."""
    if ref.shape != got.shape:
        return f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    ref64, got64 = host64(ref), host64(got)
    if not torch.isfinite(got64).all() and torch.isfinite(ref64).all():
        return f"{what}: non-finite values where the reference is finite"
    close = torch.isclose(got64, ref64, rtol=tol.rtol, atol=tol.atol)
    if close.all():
        return None
    abs_err, rel_err = max_errors(ref, got)
    return f"{what}: max abs err {abs_err:.3g}, max rel err {rel_err:.3g} exceeds {tol} ({_first_mismatch(close, ref64, got64)})"


def _first_mismatch(close: torch.Tensor, ref: torch.Tensor, got: torch.Tensor) -> str:
    """How many elements differ, and the first one: its index and both values."""
    flat = int(torch.argmin(close.flatten().int()))
    index, rest = [], flat
    for size in reversed(close.shape):
        rest, i = divmod(rest, size)
        index.insert(0, i)
    return (f"{int((~close).sum())} of {close.numel()} elements; first at {index}: "
            f"{got.flatten()[flat].item():.6g} vs {ref.flatten()[flat].item():.6g}")


def truth_problem(what: str, ref: torch.Tensor, got: torch.Tensor, truth: torch.Tensor, bound: TruthBound) -> str | None:
    """None when `got` is within the bound's factor of eager's (`ref`) normwise distance to the fp64 `truth`."""
    if ref.shape != got.shape:
        return f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    ref64, got64, true64 = host64(ref), host64(got), host64(truth)
    if not torch.isfinite(got64).all() and torch.isfinite(ref64).all():
        return f"{what}: non-finite values where the reference is finite"
    scale = float(true64.norm())
    mine, eager = float((got64 - true64).norm()), float((ref64 - true64).norm())
    floor = bound.floor_of(truth)  # the dtype's, or the case's other summation orders' spread
    limit = bound.factor * max(eager, floor * scale)
    if mine <= limit:
        return None
    abs_err, _ = max_errors(ref, got)
    rel = (lambda e: e / scale) if scale else (lambda e: e)
    return (f"{what}: error vs the fp64 truth {rel(mine):.3g} (normwise, relative) exceeds {bound.factor:g} x "
            f"max(eager's {rel(eager):.3g}, floor {floor:.3g}); max abs err vs eager {abs_err:.3g}")


def grad_mismatches(ref: dict, got: dict, tol: Tolerance, label: str, truth: dict | None = None,
                    bound: TruthBound | None = None) -> list[str]:
    """Messages for every gradient (present in both) that differs beyond `tol`, or, given the fp64 `truth`
    gradients of the same pass and a `bound`, beyond the bound."""
    problems = []
    for name, ref_grad in ref.items():
        got_grad = got.get(name)
        if ref_grad is None or got_grad is None:
            continue  # None-ness is the presence check's job
        what = f"{label} grad of {name}".strip()
        true = truth.get(name) if truth is not None else None
        msg = truth_problem(what, ref_grad, got_grad, true, bound) if true is not None and bound else \
            compare_tensor(what, ref_grad, got_grad, tol)
        if msg:
            problems.append(msg)
    return problems


def worst_errors(ref: dict, got: dict) -> tuple[float, float]:
    pairs = [(r, got.get(n)) for n, r in ref.items() if r is not None and got.get(n) is not None]
    errs = [max_errors(r, g) for r, g in pairs if r.shape == g.shape]
    return max((e[0] for e in errs), default=0.0), max((e[1] for e in errs), default=0.0)


def _later_steps(ref: Record, got: Record, truth: Record | None, tol: Tolerance) -> list[tuple]:
    """(label, ref grads, got grads, truth grads, tolerance) of every iteration after the first that both runs
    completed."""
    pairs = []
    for k in range(1, steps_compared(ref, got)):
        true = truth.steps[k].grads if truth is not None and len(truth.steps) > k else None
        step = ref.steps[k]
        pairs.append((f"iteration {step.iteration}:", step.grads, got.steps[k].grads, true, tol.at(step.iteration)))
    return pairs


def trains(record: Record) -> bool:
    """Whether the run had something to train: a parameter needing a gradient, or an input that needs one."""
    x = record.inputs_before.get("input x")
    return any(record.requires_grad_after.values()) or bool(x and x.meta.get("requires_grad"))


def compared_nothing(check: str, case_id: str, backend: str, ref: Record, got: Record) -> Verdict | None:
    """The verdict of a check that found no backward pass both runs completed (None where there is one): passing
    only when the case has nothing to train (then backward raises for the reference too: `ending` compares how);
    else failing as not observed, whichever run ended early."""
    if passes_compared(ref, got):
        return None
    if ref.passes_done == 0 and not trains(ref):
        return Verdict(check, True, figures={"passes_compared": 0, "compared": "nothing: nothing in the case needs a "
                                                                             "gradient (ending compares the raise)"})
    who = "the run" if ref.passes_done else f"{ref.backend}, the reference,"
    return not_observed(check, case_id, backend, f"{who} completed no backward pass although the case trains "
                                                 f"(ending says how it ended)", {"passes_compared": 0},
                        "ending" if ref.passes_done else None)


def grad_parity(case_id: str, backend: str, ref: Record, got: Record, tol: Tolerance, pass_index: int = -1,
                bound: TruthBound | None = None) -> Verdict:
    """Compare the gradients after backward pass `pass_index` of the first iteration (default: the last one both
    runs completed; how each run ended is the `ending` check's, so a raise at pass k leaves the passes before it
    compared) and, by default, after every later iteration both completed (before its optimizer step)."""
    nothing = compared_nothing("grad_parity", case_id, backend, ref, got)
    if nothing is not None:
        return nothing
    both = passes_compared(ref, got)
    index = both - 1 if pass_index == -1 else pass_index
    truth = bound.truth if bound is not None else None
    true = truth.grads[index] if truth is not None and len(truth.grads) > index else None
    label = "" if ref.steps[1:] == [] or pass_index != -1 else "iteration 1:"
    compared = [(label, ref.grads[index], got.grads[index], true, tol)]
    if pass_index == -1:
        compared += _later_steps(ref, got, truth, tol)
    problems, tensors, elements = [], 0, 0
    for label, ref_grads, got_grads, true_grads, step_tol in compared:
        problems += grad_mismatches(ref_grads, got_grads, step_tol, label, true_grads, bound)
        pairs = [(r, got_grads.get(n)) for n, r in ref_grads.items() if r is not None and got_grads.get(n) is not None]
        tensors, elements = tensors + len(pairs), elements + sum(r.numel() for r, _ in pairs)
    abs_err, rel_err = worst_errors(ref.grads[index], got.grads[index])
    figures = {"max_abs_err": abs_err, "max_rel_err": rel_err, "rtol": tol.rtol, "atol": tol.atol, "passes_compared": both,
               "iterations_compared": len(compared), "grads_compared": tensors, "grad_elements_compared": elements}
    if bound is not None:
        figures["tolerance"] = bound.source
    if not problems:
        return Verdict("grad_parity", True, figures=figures)
    head = f"[{case_id}] backend {backend}: gradient parity vs {ref.backend} failed"
    return Verdict("grad_parity", False, "; ".join([head, *problems]), figures, tuple(problems))
