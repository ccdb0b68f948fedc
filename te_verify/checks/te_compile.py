"""te_compile_path: a torch_compile_te run took the path TE's code gives its case (te_verify.te.compile_path's
table), read from what the compiler did (probes.te_compile), never from TE's report of itself.

- TE's compiled path expected (torch has the opaque-object API; te.Linear; no delayed wgrad, main_grad, FP8 weight
  caching or delayed scaling): every TE layer's op in Dynamo's graphs and no TE fallback break, else it fails naming
  the layers that fell back, TE's reason and the graph breaks.
- A fallback TE's code gives the case (or the environment: torch < 2.14): no verdict (a fallback is never a pass of
  the compiled path); the row says `te_compile_check: not applicable: <why>` beside `te_compile_path: fallback` and
  TE's words. A fallback case in which TE's op ran anyway fails: the table no longer describes TE.
- Nothing compiled and no graph break (the run raised before its first compile): not observed.
"""
from __future__ import annotations

from te_verify.checks.verdict import Verdict, not_observed
from te_verify.record import Record
from te_verify.te.compile_path import expected_fallback


def te_compile_verdicts(case, got: Record) -> list[Verdict]:
    """The te_compile_path verdict of a run whose callable kept a compile log (none for other backends); a fallback
    TE's code gives the case sets case.figures["te_compile_check"] instead."""
    log = got.observations.get("te_compile")
    if log is None:
        return []
    spec, name = case.spec, case.backend_name
    expected = expected_fallback(spec, any(f is not None for f in log.first_microbatch))
    path = "compiled" if not expected else "fallback: " + "; ".join(expected)
    figures = {**log.figures(), "te_compile_expected": path}
    if not log.graphs and not log.breaks:
        why = f"nothing compiled in {log.calls} call(s) (the run raised first: {got.error!r})"
        return [not_observed("te_compile_path", spec.id, name, why, figures)]
    compiled, fallen = log.layers()
    if expected:
        if log.path == "fallback":
            case.figures.update(figures, te_compile_check=f"not applicable: TE's code falls back here: {expected[0]}")
            return []
        return [Verdict("te_compile_path", False,
                        f"[{spec.id}] backend {name}: TE's op ran for layers {compiled} where TE's code falls back "
                        f"({'; '.join(expected)}): te_verify.te.compile_path's table is stale", figures)]
    if log.path == "compiled":
        return [Verdict("te_compile_path", True, "", figures)]
    reason = figures["te_compile_reason"] or "no TE reason given"
    return [Verdict("te_compile_path", False,
                    f"[{spec.id}] backend {name}: TE's compiled path should run (torch has its API, the configuration "
                    f"is one TE compiles) but layers {fallen} fell back: {reason}; {figures['graph_breaks']} graph "
                    f"break(s) {figures['graph_break_reasons']}", figures)]
