"""FP8 scaling as TE's Python drives it, read at the tex boundary below it over every iteration of a run.

Every per-tensor FP8 quantization (tex.quantize, split_quantize, bgrad_quantize) is noted with what the check needs
to hold it to the recipe's definition (checks.fp8_scaling), all measured here, none taken from TE's own accounting:
- the amax of what was quantized, computed from the source tensor as TE's kernels take it (max |x| in fp32, NaN
  skipped);
- the scale the quantization used, read from its output (1 / scale_inv);
- which quantizer it was: a delayed-scaling quantizer's scale and amax slots are views into its module's scaling
  state (TE's DelayedScalingRecipeState: scale[n], amax_history[L, n]), so (that state's storage, slot index) names
  it; a current-scaling quantizer is named by its object;
- where: its GEMM site, the weight and operand role of the GEMM that read it (probes.fp8_sites: from data flow, not
  from the backend's objects), None where no GEMM read it or its GEMM's weight was not seen quantized;
- when: the update interval (delayed scaling updates forward slots when each forward's autocast region exits and
  backward slots after each backward: the i-th forward or backward call of the run), the iteration, and the
  parameter quantized when the source is one.
After every optimizer step the state of each delayed-scaling slot (its amax history column and scale) is read from
those storages: what the next iteration will quantize with.

A run whose quantizations never reach tex (a pure-PyTorch --te-impl) has nothing here: the check says so.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from te_verify.probes.fp8_sites import GemmSites, site_label
from te_verify.probes.tex_casts import cast_wrappers
from te_verify.te.tecpu.record import patch_tex, restore_tex

DELAYED, CURRENT = "delayed", "current"


@dataclass(frozen=True)
class Quantization:
    """One FP8 quantization at the tex boundary."""

    # "delayed" (Float8Quantizer) or "current" (Float8CurrentScalingQuantizer).
    kind: str
    # The quantizer: (scaling state storage id, slot index) for delayed scaling; (id of the quantizer object, 0) else.
    slot: tuple[int, int]
    # ("forward" | "backward", k): the call it ran in, the k-th forward or backward call of the run (1-based).
    interval: tuple[str, int]
    # Forward and backward calls begun so far: a delayed-scaling slot is updated when a call of its own direction
    # ends, so a forward tensor quantized during a backward call waits for the next forward's update.
    calls: tuple[int, int]
    # The training iteration (1-based).
    iteration: int
    # The parameter quantized (its qualified name), or None for an activation or a gradient.
    source: str | None
    # max |x| of the source, fp32, NaN skipped (as TE's cast kernels compute it).
    amax: float
    # The scale the quantization used: 1 / its output's scale_inv.
    scale_used: float
    # The FP8 format's maximum for the quantizer's dtype (E4M3 448, E5M2 57344).
    fp8_max: float
    # Its GEMM site ("0.weight's input"; probes.fp8_sites), or None where none was found.
    site: str | None = None


@dataclass
class SlotState:
    """Where one delayed-scaling slot's state lives, to read it after each step."""

    # Its scale, a one-element view into the state's scale vector.
    scale: torch.Tensor
    # Its amax history column (L values, [0] the slot the next quantization writes).
    history: torch.Tensor


def source_amax(x: torch.Tensor) -> float:
    """max |x| as TE's cast kernels take it: in fp32, NaN elements skipped, an inf kept."""
    if x.numel() == 0:
        return 0.0
    return float(x.detach().abs().float().nan_to_num(nan=0.0, posinf=float("inf")).max())


def _fp8_max(q: Any) -> float:
    name = getattr(q.dtype, "name", str(q.dtype))
    return {"kFloat8E4M3": 448.0, "kFloat8E5M2": 57344.0}.get(name, float("nan"))


class Fp8ScalingObserver:
    """Notes every quantization of a run (probes protocol: entered around every iteration, `phase` before each
    forward and backward call, `step_done(k)` after the k-th optimizer step)."""

    name = "fp8_scaling"
    spans_iterations = True  # entered around the whole run, not only the first iteration

    def __init__(self, history_len: int) -> None:
        # The recipe's amax_history_len: the rows of a delayed-scaling state's history.
        self.history_len = history_len
        self.quantizations: list[Quantization] = []
        self.slots: dict[tuple[int, int], SlotState] = {}
        self.states: list[dict[tuple[int, int], tuple[list[float], float]]] = []
        self.params: dict[int, str] = {}
        self._roots: list[torch.nn.Module] = []
        self._calls = {"forward": 0, "backward": 0}
        self._interval = ("forward", 0)
        self._iteration = 1
        self._saved: list[tuple[str, Callable]] = []
        # Every current-scaling quantizer noted, held: its slot is its id(), which a freed quantizer would pass on to
        # a later object (TE's compiled path copies quantizers per tensor spec: a gradient's E5M2 copy, once freed,
        # could lend its id to a forward quantizer and be named as one).
        self._noted: dict[int, Any] = {}
        self.gemm_sites = GemmSites(lambda i: self.quantizations[i].source)

    def bind(self, model: torch.nn.Module) -> None:
        self.params = {p.untyped_storage().data_ptr(): name for name, p in model.named_parameters()}
        self._roots.append(model)

    def bind_callable(self, fn: Any) -> None:
        """The backend's callable: the TE modules it holds (te_eager's stack) name the slots of their state."""
        for root in (fn, getattr(fn, "__wrapped__", None)):
            if isinstance(root, torch.nn.Module):
                self._roots.append(root)

    def weight_uses(self) -> dict[str, int]:
        """How many modules of the backend's callable hold each parameter (a tied weight: each use quantizes it)."""
        uses: dict[str, int] = {}
        for root in self._roots[1:]:  # the callable's modules (the model's own are not the ones run)
            for module in root.modules():
                for p in module._parameters.values():
                    name = self.params.get(p.untyped_storage().data_ptr()) if p is not None else None
                    if name is not None:
                        uses[name] = uses.get(name, 0) + 1
        return uses

    def slot_names(self) -> dict[tuple[int, int], str]:
        """Each delayed-scaling slot named by its module and role: TE's modules keep their forward and backward
        states in fp8_meta["scaling_fwd"/"scaling_bwd"] (slots input, weight, output per GEMM forward; grad_output,
        grad_input backward). Slots of modules not found (thunder's executor keeps its own) keep a numbered name."""
        names = {}
        for root in self._roots:
            for qualified, module in root.named_modules():
                meta = getattr(module, "fp8_meta", None)
                label = getattr(module, "name", None) or qualified or type(module).__name__
                for key, roles in (("scaling_fwd", ("input", "weight", "output")), ("scaling_bwd", ("grad_output", "grad_input"))):
                    history = getattr(meta.get(key), "amax_history", None) if isinstance(meta, dict) else None
                    if not isinstance(history, torch.Tensor):
                        continue
                    for i in range(history.shape[-1]):
                        names[(history.untyped_storage().data_ptr(), i)] = _role(label, roles, i, history.shape[-1])
                quantizers = getattr(module, "quantizers", None)
                for key, roles in (("scaling_fwd", ("input", "weight", "output")), ("scaling_bwd", ("grad_output", "grad_input"))):
                    group = quantizers.get(key) or [] if isinstance(quantizers, dict) else []
                    for i, q in enumerate(group):
                        names.setdefault((id(q), 0), _role(label, roles, i, len(group)))
        return names

    def __enter__(self) -> "Fp8ScalingObserver":
        patch_tex(self._saved, cast_wrappers(self._note) + self.gemm_sites.wrappers())
        return self

    def __exit__(self, *exc: object) -> None:
        restore_tex(self._saved)

    def phase(self, name: str, index: int = 0) -> None:
        if name in self._calls:
            self._calls[name] += 1
            self._interval = (name, self._calls[name])

    def step_done(self, iteration: int) -> None:
        """The state of every delayed-scaling slot after the optimizer step ending `iteration`."""
        self.states.append({key: ([float(v) for v in s.history], float(s.scale.reshape(-1)[0]))
                            for key, s in self.slots.items()})
        self._iteration = iteration + 1

    def _note(self, x: torch.Tensor, q: Any, out: Any) -> None:
        kind = DELAYED if type(q).__name__ == "Float8Quantizer" else CURRENT
        if type(q).__name__ not in ("Float8Quantizer", "Float8CurrentScalingQuantizer") or out is None:
            return  # block-scaled quantizers: not per-tensor scaling
        if kind == CURRENT:
            self._noted[id(q)] = q
        slot = self._slot(q) if kind == DELAYED else (id(q), 0)
        scale_inv = float(out._scale_inv.reshape(-1)[0])
        source = self.params.get(x.untyped_storage().data_ptr()) if x.storage_offset() == 0 else None
        self.quantizations.append(Quantization(kind, slot, self._interval,
                                               (self._calls["forward"], self._calls["backward"]), self._iteration,
                                               source, source_amax(x), 1.0 / scale_inv if scale_inv else float("inf"),
                                               _fp8_max(q)))
        self.gemm_sites.note(len(self.quantizations) - 1, out)

    def _slot(self, q: Any) -> tuple[int, int]:
        """The slot of a delayed-scaling quantizer: its amax is amax_history[0][i] of an (L, n) state."""
        storage = q.amax.untyped_storage()
        key = (storage.data_ptr(), q.amax.storage_offset())
        if key not in self.slots:
            n = storage.nbytes() // q.amax.element_size() // self.history_len
            column = torch.as_strided(q.amax.detach(), (self.history_len,), (n,), q.amax.storage_offset())
            self.slots[key] = SlotState(q.scale.detach(), column)
        return key

    def figures(self) -> dict[str, Any]:
        return {"fp8_quantizations": len(self.quantizations), "fp8_delayed_slots": len(self.slots)}

    def observations(self) -> dict[str, Any]:
        sites = self.gemm_sites.sites
        quantizations = [replace(q, site=site_label(sites[i])) if i in sites else q
                         for i, q in enumerate(self.quantizations)]
        return {"fp8_scaling": {"quantizations": quantizations, "states": list(self.states),
                                "forward_calls": self._calls["forward"], "backward_calls": self._calls["backward"],
                                "slot_names": self.slot_names(), "weight_uses": self.weight_uses()}}


def _role(label: str, roles: tuple[str, ...], i: int, slots: int) -> str:
    gemm = f" gemm {i // len(roles)}" if slots > len(roles) else ""
    return f"layer {label}{gemm} {roles[i % len(roles)]}"


def scaling_observer(spec) -> Fp8ScalingObserver | None:
    """The observer for an FP8 TE case (None without a recipe)."""
    if spec.te is None or spec.te.recipe is None:
        return None
    return Fp8ScalingObserver(spec.te.amax_history_len)
