"""NVFP4 quantizations as TE's Python asks tex for them, read at the tex boundary over every iteration of a run.

Every NVFP4 quantization (tex.quantize, split_quantize, bgrad_quantize) is counted by phase and by whether its
quantizer rounds stochastically (TE's NVFP4BlockScaling sets it for gradients). Of each stochastic one the source and
what the quantization stored are kept (host copies made in the dispatch watcher's idle phase: no memory of the
run's), read from the output's buffers (the bytes a GEMM reads), nothing from TE's own accounting: checks.nvfp4_sr
holds them to the format's definition and to stochastic rounding's contract, and the same-quantization reference
rounds as they did (te.reference.sr_replay).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from te_verify.probes import dispatch
from te_verify.te.tecpu import block_scales, nvfp4
from te_verify.probes.tex_casts import cast_wrappers
from te_verify.te.tecpu.record import patch_tex, restore_tex

HOST = torch.device("cpu")


@dataclass(frozen=True)
class StoredCopy:
    """One direction of an NVFP4 quantization's output, as stored (the columnwise one is of the transpose)."""

    # E2M1 element values (fp32), in the stored orientation.
    values: torch.Tensor
    # The E4M3 block scales (fp32 values), one per 16 elements along the stored rows.
    scales: torch.Tensor
    # The per-tensor amax the copy was scaled under.
    amax: float


@dataclass(frozen=True)
class StochasticQuantization:
    """One NVFP4 quantization whose quantizer rounds stochastically."""

    # The source as quantized, 2-D (rows, last dim), its dtype kept (the RHT rounds to bf16 from it).
    source: torch.Tensor
    # 16x16 tiles (2-D quantization) and the random Hadamard transform of the columnwise copy.
    two_d: bool
    rht: bool
    # The training iteration (1-based) and the phase it ran in ("forward" or "backward").
    iteration: int
    phase: str
    # What it stored, per direction (None where the quantizer made no such copy).
    rowwise: StoredCopy | None
    columnwise: StoredCopy | None


def _stored(out: Any, columnwise: bool) -> StoredCopy | None:
    data = out._columnwise_data if columnwise else out._rowwise_data
    if data is None:
        return None
    data = data.reshape(-1, data.shape[-1]).to(HOST)
    buffer = (out._columnwise_scale_inv if columnwise else out._rowwise_scale_inv).to(HOST)
    blocks = data.shape[1] * 2 // nvfp4.BLOCK
    scales = block_scales.load(buffer, data.shape[0], blocks, out._with_gemm_swizzled_scales)
    amax = out._amax_columnwise if columnwise else out._amax_rowwise
    return StoredCopy(nvfp4.decode_packed(data), scales.view(torch.float8_e4m3fn).float(),
                      float(amax.reshape(-1)[0]))


class StochasticRoundingObserver:
    """Notes every NVFP4 quantization of a run (probes protocol: entered around every iteration, `phase` before each
    forward and backward call, `step_done(k)` after the k-th optimizer step)."""

    name = "nvfp4_sr"
    spans_iterations = True  # entered around the whole run, not only the first iteration

    def __init__(self) -> None:
        self.stochastic: list[StochasticQuantization] = []
        # (phase, stochastic) -> NVFP4 quantizations counted.
        self.counts: dict[tuple[str, bool], int] = {}
        self._phase, self._iteration = "forward", 1
        self._saved: list[tuple[str, Callable]] = []

    def __enter__(self) -> "StochasticRoundingObserver":
        patch_tex(self._saved, cast_wrappers(self._note))
        return self

    def __exit__(self, *exc: object) -> None:
        restore_tex(self._saved)

    def phase(self, name: str, index: int = 0) -> None:
        if name in ("forward", "backward"):
            self._phase = name

    def step_done(self, iteration: int) -> None:
        self._iteration = iteration + 1

    def _note(self, x: torch.Tensor, q: Any, out: Any) -> None:
        if type(q).__name__ != "NVFP4Quantizer" or out is None or x.numel() == 0:
            return
        stochastic = bool(q.stochastic_rounding)
        key = (self._phase, stochastic)
        self.counts[key] = self.counts.get(key, 0) + 1
        if not stochastic:
            return
        with dispatch.idle():  # the probe's copies are not the run's memory
            source = x.detach().reshape(-1, x.shape[-1]).to(HOST, copy=True)
            self.stochastic.append(StochasticQuantization(source, bool(q.with_2d_quantization), bool(q.with_rht),
                                                          self._iteration, self._phase, _stored(out, False),
                                                          _stored(out, True)))

    def figures(self) -> dict[str, Any]:
        return {f"nvfp4_{'sr' if sr else 'rn'}_quantizations_{phase}": n
                for (phase, sr), n in sorted(self.counts.items())}

    def observations(self) -> dict[str, Any]:
        return {"nvfp4_sr": {"stochastic": list(self.stochastic), "counts": dict(self.counts)}}


def stochastic_rounding_observer(spec) -> StochasticRoundingObserver | None:
    """The observer for a case whose recipe rounds gradients stochastically (spec recipe "nvfp4"), else None."""
    return StochasticRoundingObserver() if spec.te is not None and spec.te.recipe == "nvfp4" else None
