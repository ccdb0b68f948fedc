"""What a training engine's steps leave: its parameters after every step, and the state it keeps for them.

- params_after_steps: on every rank, after each optimizer step, every trainable parameter equals single-process
  eager SGD's after the same number of steps on the global batch, and every frozen parameter is bitwise what it was
  built as. A missing step fails. Given eager SGD's trajectory in fp64 (`truth`), a parameter's normwise distance
  from it may be at most the bound's factor times eager fp32's (never under its floor), as every value of the
  single-process lanes is bounded (checks.tolerances.truth_bound): the engine's optimizer steps on gradients reduced
  in another order, and over several steps that rounding compounds as eager's own does. Without it, the tolerance.
- engine_state: per rank and category (optimizer state, master copy, grad buffer: MADE_IN's keys) the bytes the
  engine holds are at most what the trainable parameters need (their elements x the state's element size; a rank's share where the engine shards the category) plus the
  padding the engine's layout may add. A surplus is room kept for frozen parameters; the message names which frozen
  parameters its size matches, and the phase that made it (the optimizer's step for its state; the wrap for buffers).
"""
from __future__ import annotations

import math

import torch

from te_verify.checks.collectives import ParamInfo, explain_surplus
from te_verify.checks.parity import compare_tensor, truth_problem
from te_verify.checks.tolerances import Tolerance, TruthBound
from te_verify.checks.verdict import Verdict
from te_verify.training import StateBytes

# Where each category's room is made: what the message names as the phase.
MADE_IN = {"optimizer_state": "step (the optimizer's first step makes its state)", "master": "wrap",
           "grad_buffer": "wrap"}


def params_after_steps(case_id: str, backend: str, want: list[dict[str, torch.Tensor]],
                       ranks: dict[int, list[dict[str, torch.Tensor | None]]], frozen: set[str] | list[set[str]],
                       tol: Tolerance, truth: list[dict[str, torch.Tensor]] | None = None,
                       bound: TruthBound | None = None) -> Verdict:
    """Every rank's parameters after each step against eager SGD's (`want[k]`: after step k + 1), within `bound` of
    the fp64 `truth` trajectory where given (module docstring). `frozen`: the parameters frozen in every step, or
    per step (a freeze schedule changes them)."""
    per_step = frozen if isinstance(frozen, list) else [frozen] * len(want)
    problems = []
    for rank, steps in sorted(ranks.items()):
        if len(steps) < len(want):
            problems.append(f"rank {rank}: {len(steps)} steps taken, {len(want)} expected")
        for k, (ref, got) in enumerate(zip(want, steps)):
            frozen = per_step[k]
            for name, value in ref.items():
                have = got.get(name)
                label = f"rank {rank}, after step {k + 1}, {'frozen ' if name in frozen else ''}{name}"
                if have is None:
                    problems.append(f"{label}: missing")
                elif name in frozen:
                    if not torch.equal(have, value):
                        problems.append(f"{label}: changed (max abs change {(have - value).abs().max().item():.3g})")
                else:
                    true = truth[k].get(name) if truth is not None and len(truth) > k else None
                    problem = (truth_problem(label, value, have, true, bound) if true is not None and bound is not None
                               else compare_tensor(label, value, have, tol))
                    problems += [problem] if problem else []
    figures = {"steps_compared": len(want), "ranks_compared": len(ranks)}
    if not problems:
        return Verdict("params_after_steps", True, figures=figures)
    return Verdict("params_after_steps", False, f"[{case_id}] backend {backend}: parameters after the optimizer step "
                   "differ from eager SGD on the global batch: " + "; ".join(problems[:8])
                   + (f"; and {len(problems) - 8} more" if len(problems) > 8 else ""), figures)


def engine_state(case_id: str, backend: str, ranks: dict[int, dict[str, StateBytes]], params: list[ParamInfo],
                 world_size: int, element_size: int = 4) -> Verdict:
    """Every rank's state bytes per category within what the trainable parameters need."""
    trainable = sum(math.prod(p.shape) for p in params if p.trainable)
    frozen = [p for p in params if not p.trainable]
    problems, figures = [], {}
    for rank, categories in sorted(ranks.items()):
        for category, held in sorted(categories.items()):
            need = trainable * element_size
            if held.sharded:
                need = math.ceil(need / world_size)
            figures[f"{category}_bytes"] = max(figures.get(f"{category}_bytes", 0), held.nbytes)
            figures[f"{category}_bytes_needed"] = need
            if held.nbytes <= need + held.slack:
                continue
            surplus = held.nbytes - need
            scale = world_size if held.sharded else 1  # a sharded surplus is a rank's share of the frozen room
            problems.append(f"rank {rank}: {category} holds {held.nbytes:,} B, the trainable parameters need "
                            f"{need:,} B (+{held.slack:,} B padding at most), made in "
                            f"{MADE_IN.get(category, 'the engine (a category of its state())')}"
                            + explain_surplus(_as_state(frozen, element_size), surplus * scale,
                                              held.slack * scale))
    if not problems:
        return Verdict("engine_state", True, figures=figures)
    return Verdict("engine_state", False, f"[{case_id}] backend {backend}: state kept for frozen parameters: "
                   + "; ".join(problems), figures)


def _as_state(frozen: list[ParamInfo], element_size: int) -> list[ParamInfo]:
    """The frozen parameters as the state room each would take (its elements at element_size)."""
    return [ParamInfo(p.name, (math.prod(p.shape),), element_size, False, p.unit) for p in frozen]
