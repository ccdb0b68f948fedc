"""What a step leaves besides values: each check names the element that differs.

- output_meta: every forward output both runs produced has the reference's dtype, shape, device and layout. The
  value checks convert both sides to fp64, so an output with eager's values in another dtype passes them. A TE
  module returns the activation dtype whatever its FP8 recipe, so eager's dtype is the rule in every lane. Strides
  are not judged: every op and autograd accept any strides, and eager's own depend on the kernel it picks (a 3-D
  input through addmm or matmul); only `.view` on the result could tell.
- grad_meta: the same for every gradient present in both runs (the model input's included), after every backward
  pass both completed (how each ended is the `ending` check's).
- requires_grad_left: every parameter's requires_grad after the run equals the reference's after its run: the
  harness freezes both the same way (the spec's masks and timing), so a difference is the backend's doing.
- inputs_left: the caller's tensors (the input x, the output cotangent; each microbatch's) are after the run what
  they were before the backend saw them: bitwise, and with the same dtype, shape, device, layout and requires_grad.
  The reference is not needed: no correct backend writes into its caller's tensors.
- memory_retained: the second training iteration (forward, backward, optimizer step) grows live memory by nothing
  (probes.retention: eager's gradients are made and freed within it, SGD's momentum was made by the first step;
  first-use allocations belong to the first iteration).
- process_state: the run left the process state as it found it (te_verify.run.process_state: grad mode, default dtype,
  threads, matmul precision, autocast, TE's FP8 autocast state, ...; the runner restored it before anything else
  ran, so the runs after it are judged as if alone). What the reference's own run left is the harness's fault, not
  the backend's: the verdict does not fail for it but carries it in its figures (`reference_process_left`, on the
  report row).
"""
from __future__ import annotations

import torch

from te_verify.checks.ending import ending_mismatch, passes_compared
from te_verify.checks.verdict import Verdict, not_observed
from te_verify.record import INPUT_GRAD, Record, tensor_meta


def meta_problems(what: str, want: dict, have: dict) -> list[str]:
    """One message per metadata field (tensor_meta's, requires_grad where recorded) on which `have` differs."""
    return [f"{what}: {field} {have.get(field)}, expected {value}" for field, value in want.items()
            if have.get(field) != value]


def _verdict(check: str, case_id: str, backend: str, problems: list[str], figures: dict) -> Verdict:
    if problems:
        return Verdict(check, False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict(check, True, figures=figures)


def output_meta(case_id: str, backend: str, ref: Record, got: Record) -> Verdict:
    """Each forward output both runs produced has the reference's dtype, shape, device and layout."""
    problems = []
    for k, (want, have) in enumerate(zip(ref.outputs, got.outputs)):
        problems += meta_problems(ref.output_label(k), tensor_meta(want), tensor_meta(have))
    return _verdict("output_meta", case_id, backend, problems,
                    {"output_meta_compared": min(len(ref.outputs), len(got.outputs))})


def grad_meta(case_id: str, backend: str, ref: Record, got: Record) -> Verdict:
    """Each gradient present in both runs has the reference's dtype, shape, device and layout, after every pass
    both completed (a gradient None on one side is grad_presence's)."""
    problems, compared = [], 0
    for k in range(passes_compared(ref, got)):
        for name, want in ref.grads[k].items():
            have = got.grads[k].get(name)
            if want is None or have is None:
                continue
            compared += 1
            what = "the model input's gradient" if name == INPUT_GRAD else f"grad of {name}"
            problems += meta_problems(f"{what} after pass {k + 1}", tensor_meta(want), tensor_meta(have))
    return _verdict("grad_meta", case_id, backend, problems, {"grad_meta_compared": compared})


def requires_grad_left(case_id: str, backend: str, ref: Record, got: Record) -> Verdict:
    """Every parameter's requires_grad after the run equals the reference's after its run."""
    problems = [f"parameter {name}: requires_grad {got.requires_grad_after.get(name)} after the run, expected {want}"
                for name, want in ref.requires_grad_after.items()
                if got.requires_grad_after and got.requires_grad_after.get(name) != want]
    return _verdict("requires_grad_left", case_id, backend, problems,
                    {"requires_grad_compared": len(got.requires_grad_after)})


def inputs_left(case_id: str, backend: str, got: Record) -> Verdict:
    """The caller's tensors after the run equal what they were before it, bitwise and in metadata."""
    problems = []
    for name, before in got.inputs_before.items():
        after = got.inputs_after.get(name)
        if after is None:  # the run ended before the snapshot (a raise in warm-up): `ending` judges
            continue
        changed = meta_problems(f"{name} after the run", before.meta, after.meta)
        if not changed and not torch.equal(before.values, after.values):
            diff = (after.values.double() - before.values.double()).abs()
            changed = [f"{name}: written by the run ({int((diff != 0).sum())} of {diff.numel()} elements changed, "
                       f"max abs change {float(diff.max()):.3g})"]
        problems += changed
    return _verdict("inputs_left", case_id, backend, problems, {"inputs_compared": len(got.inputs_after)})


def memory_retained(case_id: str, backend: str, got: Record, ref: Record | None = None, allowed: int = 0) -> Verdict:
    """The second training iteration grows live memory by nothing (probes.retention) beyond `allowed`: the optimizer
    state a freeze schedule's change before it makes for the parameters it makes trainable (models.schedule); each
    later one ("retained_later", "iteration 3: ...") by nothing beyond what its own change makes (`expected`). A run
    that ended before it (`ending` says how) or ran without the measurement fails as not observed: nothing was
    judged."""
    seen = got.observations.get("retained")
    if seen is None:
        if got.error is not None and ref is not None and ending_mismatch(ref, got) is None:
            return Verdict("memory_retained", True, figures={"retained_bytes": None, "retained_compared": "nothing: "
                                                             f"{ref.backend} ended the same way (ending)"})
        if got.error is not None:
            return not_observed("memory_retained", case_id, backend, "the run ended before its second iteration "
                                                                     "(ending says how)", {"retained_bytes": None})
        return not_observed("memory_retained", case_id, backend, "no second-iteration measurement (the run under "
                                                                 "test must run under the probes)", blocked_by=None)
    if "error" in seen and got.error is not None and got.error_iteration == 2:
        return not_observed("memory_retained", case_id, backend, f"the second iteration raised {seen['error']} "
                                                                 "(ending says how the run ended)")
    if "error" in seen:
        return Verdict("memory_retained", False, f"[{case_id}] backend {backend}: a second training step after the "
                                                 f"measured one raised {seen['error']}")
    later = {k: s for k, s in got.observations.get("retained_later", {}).items()
             if "error" not in s and (got.error is None or got.error_iteration > k)}
    figures = {"retained_bytes": seen["bytes"], "retained_source": seen["source"],
               "retained_compared": "the second iteration's net growth" + (
                   f" and iteration {', '.join(map(str, later))}'s" if later else "")}
    if allowed:
        figures["retained_allowed_bytes"] = allowed
    problems = [_retained_problem(seen, allowed)] if seen["bytes"] > allowed else []
    problems += [f"iteration {k}: " + _retained_problem(s, s.get("expected", 0)) for k, s in later.items()
                 if s["bytes"] > s.get("expected", 0)]
    if not problems:
        return Verdict("memory_retained", True, figures=figures)
    return Verdict("memory_retained", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)


def _retained_problem(seen: dict, allowed: int) -> str:
    """What a step that grew live memory beyond `allowed` retained, and what holds it."""
    where = (f"held by {', '.join(seen['holders'])}" if seen["holders"] else
             "held outside the model and the callable under test (a process-wide cache?)"
             if seen["source"] == "cpu_storage_tracker" else "holders not traced on the CUDA allocator")
    return (f"a training step after the measured one retained {seen['bytes']:,} B beyond the gradients "
            f"({seen['source']})" + (f" and the {allowed:,} B of optimizer state its schedule's newly trainable "
                                     "parameters need" if allowed else "") + f", {where}")


def process_state(case_id: str, backend: str, ref: Record, got: Record) -> Verdict:
    """The run under test left every process setting as it found it; a run that was not watched is not observed."""
    figures = {"process_settings_compared": got.process_compared}
    if ref.process_left:
        figures["reference_process_left"] = list(ref.process_left)
    if got.process_left is None:
        return Verdict("process_state", False, f"[{case_id}] backend {backend}: process state not observed (the run "
                                               "was not watched: te_verify.run.process_state.watched)", figures)
    return _verdict("process_state", case_id, backend, got.process_left, figures)


def process_left_by_test(where: str, left: list[str], compared: int) -> Verdict:
    """process_state of a whole test (the plugin keeps every test's call): what the test left outside the runs the
    runner watched; `where` names the case and backend, or the test."""
    figures = {"process_settings_compared": compared}
    if left:
        return Verdict("process_state", False, f"{where}: the test " + "; ".join(left), figures, tuple(left))
    return Verdict("process_state", True, figures=figures)


def leftover_verdicts(case_id: str, backend: str, ref: Record, got: Record, second_step: bool = True,
                      allowed: int = 0) -> list[Verdict]:
    """Every check of what a step leaves besides values; `second_step=False` where the runner takes none (the TE
    lane's microbatch families); `allowed`: memory_retained's."""
    verdicts = [output_meta(case_id, backend, ref, got), grad_meta(case_id, backend, ref, got),
                requires_grad_left(case_id, backend, ref, got), inputs_left(case_id, backend, got),
                process_state(case_id, backend, ref, got)]
    return verdicts + ([memory_retained(case_id, backend, got, ref, allowed)] if second_step else [])
