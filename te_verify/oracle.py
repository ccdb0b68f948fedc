"""Required work from a spec alone: the GEMMs by layer and role, their FLOPs, the saved tensors, a peak bound.

The rules (DESIGN.md, "What redundant means"), with the freeze masks in force during backward
(`spec.frozen_after_prepare()`):
- needs_grad(input of layer i) = the model input needs grad, or some earlier layer has a trainable weight or bias;
- fprop: always; dgrad: iff needs_grad(input of layer i); wgrad: iff the weight is trainable; bgrad (a
  reduction, not a GEMM): iff the bias is trainable;
- saved for backward: the layer input iff wgrad is needed; the weight's FP8/transposed copy iff dgrad is
  needed. Only new allocations count: a plain layer-0 input is the model input and a plain weight is a
  parameter, so neither counts; in FP8 cases both are new quantized copies (1 byte per element). Checked
  against the reference runtime (tests/test_te_waste.py): its copies are float8 tensors of exactly these sizes.
  Per-tensor scales are not copies and are not counted: the reference keeps them in one 3-element fp32 `meta`
  per layer (FP8 flag, input and weight scale_inv), made from Python data and so invisible to probes.saved;
  real TE keeps a 4-byte fp32 scale_inv beside each Float8Tensor's data.
- every backward replay repeats the backward GEMMs; the forward runs once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from te_verify.spec import CaseSpec

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2}
FP8_BYTES = 1  # an FP8 copy holds one byte per element (its per-tensor scale is not counted; see above)
BACKWARD_ROLES = ("dgrad", "wgrad")


@dataclass(frozen=True)
class RequiredSaved:
    """What backward needs kept from the forward, counting new allocations only."""

    # Total bytes of the required new saved tensors.
    nbytes: int
    # How many tensors that is.
    count: int
    # (layer, "input" | "weight_copy", bytes) per required tensor.
    items: tuple[tuple[int, str, int], ...]


def trainable_masks(spec: CaseSpec) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """(weight trainable, bias trainable) per layer, as in force during backward; no bias => False."""
    weight_frozen, bias_frozen = spec.frozen_after_prepare()
    weights = tuple(not f for f in weight_frozen)
    biases = tuple(not f for f in bias_frozen) if bias_frozen is not None else (False,) * spec.n_layers
    return weights, biases


def input_needs_grad(spec: CaseSpec) -> tuple[bool, ...]:
    """needs_grad(input of layer i) for every layer."""
    weights, biases = trainable_masks(spec)
    needs, upstream = [], spec.input_requires_grad
    for i in range(spec.n_layers):
        needs.append(upstream)
        upstream = upstream or weights[i] or biases[i]
    return tuple(needs)


def backward_gemms(spec: CaseSpec) -> list[tuple[int, str]]:
    """(layer, role) of the GEMMs one backward pass needs, last layer first."""
    weights, _ = trainable_masks(spec)
    needs = input_needs_grad(spec)
    gemms = []
    for i in reversed(range(spec.n_layers)):
        if needs[i]:
            gemms.append((i, "dgrad"))
        if weights[i]:
            gemms.append((i, "wgrad"))
    return gemms


def graph_exists(spec: CaseSpec) -> bool:
    """Whether the output needs grad at all (if not, backward raises and does no work)."""
    weights, biases = trainable_masks(spec)
    return spec.input_requires_grad or any(weights) or any(biases)


def required_gemms(spec: CaseSpec) -> list[tuple[int, str]]:
    """(layer, role) of every GEMM the run needs: fprop per layer, then each replay's backward GEMMs."""
    forward = [(i, "fprop") for i in range(spec.n_layers)]
    backward = backward_gemms(spec) if graph_exists(spec) else []
    return forward + backward * spec.replays


def required_bias_grads(spec: CaseSpec) -> list[int]:
    """Layers whose bias gradient each backward pass needs (a reduction; not counted as a GEMM)."""
    _, biases = trainable_masks(spec)
    return [i for i, trainable in enumerate(biases) if trainable]


def gemm_flops(spec: CaseSpec, layer: int) -> int:
    """FLOPs of one fprop, dgrad or wgrad GEMM of `layer`: 2 * rows * in * out (all three are equal)."""
    rows = math.prod(spec.batch_shape)
    return 2 * rows * spec.widths[layer] * spec.widths[layer + 1]


def required_flops(spec: CaseSpec) -> int:
    return sum(gemm_flops(spec, layer) for layer, _ in required_gemms(spec))


def required_saved(spec: CaseSpec) -> RequiredSaved:
    """The new tensors backward needs kept (plain or FP8 by `spec.te.recipe`)."""
    if not graph_exists(spec):
        return RequiredSaved(0, 0, ())
    fp8 = spec.te is not None and spec.te.recipe is not None
    rows = math.prod(spec.batch_shape)
    size = FP8_BYTES if fp8 else BYTES_PER_ELEMENT[spec.dtype]
    gemms = set(backward_gemms(spec))
    items = []
    for i in range(spec.n_layers):
        if (i, "wgrad") in gemms and (fp8 or i > 0):
            items.append((i, "input", rows * spec.widths[i] * size))
        if (i, "dgrad") in gemms and fp8:
            items.append((i, "weight_copy", spec.widths[i] * spec.widths[i + 1] * size))
    return RequiredSaved(sum(b for _, _, b in items), len(items), tuple(items))


def required_peak(spec: CaseSpec) -> int:
    """An upper bound on the live bytes the minimal schedule needs (new allocations only).

    The required saved tensors, the output, the gradients of trainable parameters and of the input (they
    stay alive as .grad), two activations in flight (a layer's output/grad and the next one's) and, with
    replays, one layer's weight+bias-sized temporary (a later pass's wgrad and bgrad before accumulation). The runner's own
    snapshots are taken in the probes' "idle" phase and are not counted. Not exact: allocators and schedules differ, so it bounds rather than predicts; a backend
    above it holds memory the case does not need.
    """
    size = BYTES_PER_ELEMENT[spec.dtype]
    rows = math.prod(spec.batch_shape)
    weights, biases = trainable_masks(spec)
    grads = sum(spec.widths[i] * spec.widths[i + 1] for i in range(spec.n_layers) if weights[i])
    grads += sum(spec.widths[i + 1] for i in range(spec.n_layers) if biases[i])
    grads += math.prod(spec.batch_shape) * spec.widths[0] if spec.input_requires_grad else 0
    activation = rows * max(spec.widths)
    # A layer's backward returns its wgrad and bgrad together, so one replay temporary is weight + bias sized.
    bias = 1 if spec.has_bias else 0
    weight_temp = max(spec.widths[i] * spec.widths[i + 1] + bias * spec.widths[i + 1]
                      for i in range(spec.n_layers)) if spec.replays > 1 else 0
    output = rows * spec.widths[-1]
    return required_saved(spec).nbytes + size * (output + grads + 2 * activation + weight_temp)
