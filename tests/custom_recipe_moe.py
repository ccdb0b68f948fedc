"""TE 2.20.2's GroupedLinear (4 experts) under CustomRecipe(high_precision_fwd_mxfp8_bwd) over the tex emulation at
sm100, where that recipe runs: what te_saved_bytes and fp8_copies_made say of real runs. Run as a script (one
interpreter booted at sm100; the test process may be booted at sm90), it prints {run: verdict} as JSON, a verdict
being {"ok", "message", "figures"}. Runs:
- "saved bias" / "saved nobias": te_saved_bytes where every expert trains. With biases TE keeps their bf16 casts
  (expectations/te_eager.toml), which the message names; without biases it keeps exactly the oracle's copies.
- "made clean": fp8_copies_made where nothing needs a gradient (every expert frozen, the input too): the forward runs
  in high precision, so nothing is quantized.
- "made planted": the same under a planted TE build whose hybrid quantizers make every columnwise copy.
- "made no gemms" / "made fp8 gemms" / "made unattributed gemms": the clean run's record stripped of its GEMMs, with
  them marked as reading FP8 operands, or attributed to no layer: records that missed what they judge.
- "made trains": the clean run's record judged as the case where every expert trains, whose wgrads read copies.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from typing import Iterator

from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.fp8_copies import copies_made
from te_verify.checks.te_waste import saved_bytes
from te_verify.checks.verdict import Verdict
from te_verify.matrix.te import MOE_ROWS, MOE_WIDTHS, block_spec
from te_verify.record import Record
from te_verify.run import te_case
from te_verify.run.microbatch import run_mean_reduced
from te_verify.spec import CaseSpec
from te_verify.te import api as te_api


class _Case:
    """What te_case.te_probes reads of a case."""

    def __init__(self, spec: CaseSpec) -> None:
        self.spec, self.backend_name, self.backend = spec, "te_eager", TEEagerBackend()


def moe(bias: bool, frozen: tuple[int, ...], x_grad: bool) -> CaseSpec:
    """te_moe's custom-recipe case: one GroupedLinear of 4 experts, `frozen` ones with weight and bias frozen."""
    return block_spec("te_moe", "custom", MOE_WIDTHS, (False,), (False,) if bias else None, x_grad,
                      te=dict(module="grouped_linear", experts=4, frozen_experts=frozen), batch_shape=MOE_ROWS)


def run(spec: CaseSpec) -> Record:
    case = _Case(spec)
    return run_mean_reduced(spec, case.backend, te_case.te_probes(case))


@contextlib.contextmanager
def columnwise_everywhere() -> Iterator[None]:
    """Planted TE build: every HybridQuantizer quantize makes its columnwise copy, needed or not."""
    from transformer_engine.pytorch.tensor.hybrid_tensor import HybridQuantizer

    original = HybridQuantizer.quantize_impl

    def quantize_impl(self, tensor):
        self.columnwise_usage = True
        return original(self, tensor)
    HybridQuantizer.quantize_impl = quantize_impl
    try:
        yield
    finally:
        HybridQuantizer.quantize_impl = original


def missed(record: Record, gemms: list) -> Record:
    """The record with its tex GEMM log replaced."""
    return dataclasses.replace(record, observations={**record.observations, "gemm_log": gemms})


def as_fp8(events: list) -> list:
    return [dataclasses.replace(e, gemm=dataclasses.replace(e.gemm, fp8=True)) for e in events]


def unattributed(events: list) -> list:
    return [dataclasses.replace(e, layer="?") for e in events]


def _json(verdict: Verdict) -> dict:
    return {"ok": verdict.ok, "message": verdict.message, "figures": verdict.figures}


def main() -> None:
    impl = te_api.resolve(te_api.CPU_CHOICE, "sm100")
    with te_api.using(impl):
        impl.api  # noqa: B018 -- boots TE's Python over the emulation
        out = {f"saved {'bias' if bias else 'nobias'}": _json(saved_bytes(s.id, "te_eager", s, run(s)))
               for bias in (True, False) for s in [moe(bias, (), True)]}
        idle = moe(True, (0, 1, 2, 3), False)
        clean = run(idle)
        with columnwise_everywhere():
            planted = run(idle)
        gemms = clean.observations["gemm_log"]
        for name, record in (("made clean", clean), ("made planted", planted), ("made no gemms", missed(clean, [])),
                             ("made fp8 gemms", missed(clean, as_fp8(gemms))),
                             ("made unattributed gemms", missed(clean, unattributed(gemms)))):
            out[name] = _json(copies_made(idle.id, "te_eager", idle, record))
        trains = moe(True, (), False)
        out["made trains"] = _json(copies_made(trains.id, "te_eager", trains, clean))
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    sys.exit(main())
