"""Required work from a spec alone: the GEMMs by layer and role, their FLOPs, the saved tensors, a peak bound.

The rules (DESIGN.md, "What redundant means"), with the freeze masks in force during backward
(`spec.frozen_after_prepare()`):
- needs_grad(input of layer i) = the model input needs grad, or some earlier layer has a trainable weight or bias;
- fprop: always; dgrad: iff needs_grad(input of layer i); wgrad: iff the weight is trainable; bgrad (a
  reduction, not a GEMM): iff the bias is trainable;
- saved for backward: the layer input iff wgrad is needed; the weight's FP8/transposed copy iff dgrad is
  needed. Only new allocations count: a plain layer-0 input is the model input and a plain weight is a
  parameter, so neither counts; in FP8 cases both are new quantized copies in TE's per-tensor format: one
  layout of the data (1 byte per element: the columnwise copy the backward GEMM reads on sm90, the rowwise one
  on sm100) and its scale_inv (one fp32 element in its own storage), so two storages per copy.
- autocast (spec.autocast): each GEMM reads low-precision copies made in the forward (one cast per weight and per
  input); the copy of the layer input is saved iff wgrad is needed, the weight's copy iff dgrad is needed (what
  eager's autocast saves), each once and in the autocast's dtype. A saved copy of a frozen weight whose dgrad is not
  needed, or a second copy of one, is waste.
- every backward replay repeats the backward GEMMs; the forward runs once.
- experts (TE's GroupedLinear, spec.te.experts > 1): each expert of a layer is its own site ("2.e1") on its share
  of the rows, with its own weight; chunk k of the rows flows through expert k of every layer, so an expert's
  input needs grad iff the model input does or an earlier layer's expert k is trainable.
- layer norms (spec.te.module in NORM_MODULES: TE's LayerNormLinear): layer i normalizes its input first, the
  norm's scale and shift frozen with the layer's bias (its weight without biases). The linear's input (the norm's
  output) needs grad iff the layer input does or the norm is trainable, and a trainable norm makes later inputs need
  grad. Saved, per layer: the norm's output iff wgrad (a new allocation on every layer, layer 0's too); the norm's
  input (unless the model input), mean and 1/sigma (fp32, one per row) iff the norm's backward is needed, which is
  iff the linear's input needs grad.
- MLPs (spec.te.module in MLP_MODULES: TE's LayerNormMLP): each pair of layers is fc1 behind a layer norm (as above)
  and fc2 behind an activation. fc2's input (the activation's output, a new allocation) is saved iff its wgrad, and
  the activation's input (fc1's output) iff the activation's backward is needed, which is iff fc2's input needs grad.
- model families (spec.model): the same rules per linear site, with "needs grad" read from the model's module
  graph (te_verify.oracle.graph); sites fed one value save it once, and the model input is never a new save.
  Required work for what is not a linear site (attention, norms, activations) is not derived: the checks
  report it beside the sites' figures.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from te_verify.oracle.copy_bytes import HIGH_PRECISION_FPROP, backward_layout, layout_storages
from te_verify.oracle.recompute import checkpoint_inputs, recomputed_labels, recomputed_sites, working_elements
from te_verify.oracle.sites import Site
from te_verify.spec import MLP_MODULES, NORM_MODULES, CaseSpec

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2}
FP8_BYTES = 1  # an FP8 copy's data holds one byte per element
SCALE_INV_BYTES = 4  # and its per-tensor scale_inv one fp32 element, in a storage of its own
NORM_STAT_BYTES = 4  # a layer norm's mean and 1/sigma: one fp32 element per row each
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


@functools.lru_cache(maxsize=256)
def _model_graph(spec: CaseSpec) -> tuple[tuple[Site, ...], bool]:
    """A model family's sites and whether any value needs a gradient, from its module graph as frozen at backward."""
    from te_verify.oracle.graph import graph_sites
    from te_verify.models import CPU, frozen_at_backward, make_inputs

    model = frozen_at_backward(spec.replace(recompute="none"), CPU)  # the same sites; fx traces no checkpoint
    x = make_inputs(spec, device=CPU).x
    return tuple(graph_sites(model, x)), x.requires_grad or any(p.requires_grad for p in model.parameters())


def sites(spec: CaseSpec) -> list[Site]:
    """Every linear site, layer-major; one per layer without experts; a model family's in module order."""
    if spec.model is not None:
        return list(_model_graph(spec)[0])
    weights, biases = trainable_masks(spec)
    experts = spec.te.experts if spec.te is not None else 1
    frozen = set(spec.te.frozen_experts) if spec.te is not None else set()
    rows = math.prod(spec.batch_shape) // experts
    upstream = [spec.input_requires_grad] * experts
    norms = trainable_norms(spec)
    out = []
    for i in range(spec.n_layers):
        for k in range(experts):
            w, b = weights[i] and k not in frozen, biases[i] and k not in frozen
            label = str(i) if experts == 1 else f"{i}.e{k}"
            upstream[k] = upstream[k] or norms[i]
            out.append(Site(label, i, rows, spec.widths[i], spec.widths[i + 1], w, b, upstream[k],
                            input_is_model_input=i == 0))
            upstream[k] = upstream[k] or w or b
    return out


def is_mlp(spec: CaseSpec) -> bool:
    """Whether the stack's layers pair into MLPs (TE's LayerNormMLP: fc1 behind a norm, fc2 behind an activation)."""
    return spec.te is not None and spec.te.module in MLP_MODULES


def norm_layers(spec: CaseSpec) -> tuple[bool, ...]:
    """Per layer, whether it normalizes its input first: every layer of TE's LayerNormLinear, each MLP's fc1."""
    every = spec.te is not None and spec.te.module in NORM_MODULES
    return tuple(every or (is_mlp(spec) and i % 2 == 0) for i in range(spec.n_layers))


def activated_layers(spec: CaseSpec) -> tuple[bool, ...]:
    """Per layer, whether an activation runs on its input first: each MLP's fc2."""
    return tuple(is_mlp(spec) and i % 2 == 1 for i in range(spec.n_layers))


def trainable_norms(spec: CaseSpec) -> tuple[bool, ...]:
    """Per layer, whether its layer norm is trainable in backward (False for a layer without one)."""
    weights, biases = trainable_masks(spec)
    return tuple(has and t for has, t in zip(norm_layers(spec), biases if spec.has_bias else weights))


def trainable_masks(spec: CaseSpec) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """(weight trainable, bias trainable) per layer, as in force during backward; no bias => False."""
    weight_frozen, bias_frozen = spec.frozen_after_prepare()
    weights = tuple(not f for f in weight_frozen)
    biases = tuple(not f for f in bias_frozen) if bias_frozen is not None else (False,) * spec.n_layers
    return weights, biases


def input_needs_grad(spec: CaseSpec) -> tuple[bool, ...]:
    """needs_grad(input of layer i) for every layer."""
    weights, biases = trainable_masks(spec)
    norms = trainable_norms(spec)
    needs, upstream = [], spec.input_requires_grad
    for i in range(spec.n_layers):
        upstream = upstream or norms[i]
        needs.append(upstream)
        upstream = upstream or weights[i] or biases[i]
    return tuple(needs)


def backward_gemms(spec: CaseSpec) -> list[tuple[int, str]]:
    """(layer, role) of the GEMMs one backward pass needs, last layer first (a model family: last site first), then
    the fprop GEMMs a recompute runs again (oracle.recompute)."""
    recomputed = [(s.layer, "fprop") for s in recomputed_sites(spec, sites(spec))]
    if spec.model is not None:
        return [(s.layer, role) for s in reversed(sites(spec)) for role in ("dgrad", "wgrad")
                if role in s.roles()] + recomputed
    weights, _ = trainable_masks(spec)
    needs = input_needs_grad(spec)
    gemms = []
    for i in reversed(range(spec.n_layers)):
        if needs[i]:
            gemms.append((i, "dgrad"))
        if weights[i]:
            gemms.append((i, "wgrad"))
    return gemms + recomputed


def graph_exists(spec: CaseSpec) -> bool:
    """Whether the output needs grad at all (if not, backward raises and does no work)."""
    if spec.model is not None:
        return _model_graph(spec)[1]
    return spec.input_requires_grad or any(s.weight_trainable or s.bias_trainable for s in sites(spec))


def required_gemms(spec: CaseSpec) -> list[tuple[int, str]]:
    """(layer, role) of every GEMM the run needs: fprop per layer, then each replay's backward GEMMs."""
    forward = forward_gemms(spec)
    backward = backward_gemms(spec) if graph_exists(spec) else []
    return forward + backward * spec.replays


def forward_gemms(spec: CaseSpec) -> list[tuple[int, str]]:
    """(layer, "fprop") per layer (a model family: per site)."""
    if spec.model is not None:
        return [(s.layer, "fprop") for s in sites(spec)]
    return [(i, "fprop") for i in range(spec.n_layers)]


def required_bias_grads(spec: CaseSpec) -> list[int]:
    """Layers whose bias gradient each backward pass needs (a reduction; not counted as a GEMM)."""
    _, biases = trainable_masks(spec)
    return [i for i, trainable in enumerate(biases) if trainable]


def gemm_flops(spec: CaseSpec, layer: int) -> int:
    """FLOPs of one fprop, dgrad or wgrad GEMM of `layer`: 2 * rows * in * out (all three are equal)."""
    rows = math.prod(spec.batch_shape)
    return 2 * rows * spec.widths[layer] * spec.widths[layer + 1]


def required_flops(spec: CaseSpec) -> int:
    """fprop of every site once, and each backward pass's required dgrad and wgrad GEMMs and recomputed fprops."""
    replays = spec.replays if graph_exists(spec) else 0
    recomputed = sum(s.gemm_flops() for s in recomputed_sites(spec, sites(spec)))
    return sum(s.gemm_flops() * (1 + replays * len(s.roles() - {"bgrad"})) for s in sites(spec)) + replays * recomputed


def operand_bytes(spec: CaseSpec, site: Site, role: str) -> int:
    """Bytes one GEMM of `role` reads (fprop x and W, dgrad dy and W, wgrad x and dy): one byte an element where
    the case quantizes to FP8 (every GEMM of a TE FP8 recipe), else the case's element size. Split along K, the
    parts read the same bytes between them."""
    x, w, dy = site.rows * site.fan_in, site.fan_in * site.fan_out, site.rows * site.fan_out
    elements = {"fprop": x + w, "dgrad": dy + w, "wgrad": x + dy}[role]
    fp8 = spec.te is not None and spec.te.recipe is not None
    fp8 = fp8 and not (role == "fprop" and spec.te.recipe in HIGH_PRECISION_FPROP)
    return elements * (FP8_BYTES if fp8 else BYTES_PER_ELEMENT[compute_dtype(spec)])


def required_roles(spec: CaseSpec) -> dict[str, set[str]]:
    """Site label -> backward roles required ("dgrad", "wgrad", "bgrad"), from the masks in force at backward."""
    return {s.label: s.roles() for s in sites(spec)}


def fp8_copy_storages(site: Site, kind: str, recipe: str = "delayed") -> list[tuple[str, int]]:
    """The storages of the FP8 copy backward reads of a site's input or weight ("input" or "weight"): one layout
    (oracle.copy_bytes.backward_layout) of the data and its scales, as the recipe's format stores them."""
    m, k = (site.rows, site.fan_in) if kind == "input" else (site.fan_out, site.fan_in)
    return layout_storages(recipe, kind, m, k, backward_layout(recipe))


def fp8_copy_bytes(site: Site, kind: str, recipe: str = "delayed") -> int:
    """Bytes of one FP8 copy backward reads (fp8_copy_storages summed)."""
    return sum(b for _, b in fp8_copy_storages(site, kind, recipe))


def compute_dtype(spec: CaseSpec) -> str:
    """The dtype a case's GEMMs run in: its autocast's where it runs under one, else its parameters'."""
    return spec.autocast or spec.dtype


def autocast_copy_bytes(spec: CaseSpec, site: Site, kind: str) -> int:
    """Bytes of the low-precision copy of a site's input or weight ("input" or "weight") a GEMM under autocast reads
    and backward keeps: one cast per forward, in the autocast's dtype. Layer 0's input is a new copy of the model
    input too (the model input itself is fp32)."""
    elements = site.rows * site.fan_in if kind == "input" else site.fan_in * site.fan_out
    return elements * BYTES_PER_ELEMENT[compute_dtype(spec)]


def required_saved(spec: CaseSpec) -> RequiredSaved:
    """The new tensors backward needs kept (plain or FP8 by `spec.te.recipe`), per site."""
    if not graph_exists(spec):
        return RequiredSaved(0, 0, ())
    if spec.model is not None:
        return _family_saved(spec)
    if spec.recompute != "none":  # the stack's regions cover every layer: their inputs, nothing inside
        items = [(s.layer, "input", s.rows * s.fan_in * BYTES_PER_ELEMENT[spec.dtype])
                 for s in checkpoint_inputs(spec, sites(spec)) if s.layer > 0]
        return RequiredSaved(sum(b for _, _, b in items), len(items), tuple(items))
    fp8 = spec.te is not None and spec.te.recipe is not None
    normed, activated = norm_layers(spec), activated_layers(spec)  # a norm's output is its layer's new input
    items = []
    for s in sites(spec):
        for kind, role, label in (("input", "wgrad", "input"), ("weight", "dgrad", "weight_copy")):
            if role not in s.roles():
                continue
            if fp8:
                items += [(s.layer, label if part == "data" else f"{label}_{part}", b)
                          for part, b in fp8_copy_storages(s, kind, spec.te.recipe)]
            elif spec.autocast:
                items.append((s.layer, label, autocast_copy_bytes(spec, s, kind)))
            elif kind == "input" and (s.layer > 0 or normed[s.layer]):
                items.append((s.layer, label, s.rows * s.fan_in * BYTES_PER_ELEMENT[spec.dtype]))
        if normed[s.layer] and s.input_needs_grad:
            items += _norm_saved(spec, s)
        if activated[s.layer] and s.input_needs_grad:  # the activation's input, for its backward
            items.append((s.layer, "act_input", s.rows * s.fan_in * BYTES_PER_ELEMENT[spec.dtype]))
    return RequiredSaved(sum(b for _, _, b in items), len(items), tuple(items))


def _norm_saved(spec: CaseSpec, site: Site) -> list[tuple[int, str, int]]:
    """What a layer norm's backward reads: its input (unless the model input), its mean and 1/sigma."""
    items = [] if site.input_is_model_input else [
        (site.layer, "norm_input", site.rows * site.fan_in * BYTES_PER_ELEMENT[spec.dtype])]
    return items + [(site.layer, stat, site.rows * NORM_STAT_BYTES) for stat in ("norm_mean", "norm_rsigma")]


def _family_saved(spec: CaseSpec) -> RequiredSaved:
    """A model family's linear sites: each value a wgrad reads, once, unless it is the model input or the site is
    in a checkpointed block (recomputed; the block's input is kept instead, not a site's value)."""
    items, seen = [], set()
    recomputed = recomputed_labels(spec, sites(spec))
    for s in sites(spec):
        if s.label in recomputed:
            continue
        if "wgrad" in s.roles() and not s.input_is_model_input and s.input_value not in seen:
            seen.add(s.input_value)
            items.append((s.layer, "input", s.rows * s.fan_in * BYTES_PER_ELEMENT[compute_dtype(spec)]))
    return RequiredSaved(sum(b for _, _, b in items), len(items), tuple(items))


def required_peak(spec: CaseSpec) -> int:
    """An upper bound on the live bytes the minimal schedule needs (new allocations only).

    The required saved tensors, the output, the gradients of trainable parameters and of the input (they
    stay alive as .grad), two activations in flight (a layer's output/grad and the next one's) and, with
    replays, one layer's weight+bias-sized temporary (a later pass's wgrad and bgrad before accumulation), and with
    recompute the activations one region's recompute makes again (oracle.recompute.working_elements). The runner's own
    snapshots are taken in the probes' "idle" phase and are not counted. Not exact: allocators and schedules differ, so it bounds rather than predicts; a backend
    above it holds memory the case does not need.
    """
    size = BYTES_PER_ELEMENT[spec.dtype]
    rows = math.prod(spec.batch_shape)
    weights, biases = trainable_masks(spec)
    grads = sum(spec.widths[i] * spec.widths[i + 1] for i in range(spec.n_layers) if weights[i])
    grads += sum(spec.widths[i + 1] for i in range(spec.n_layers) if biases[i])
    grads += math.prod(spec.batch_shape) * spec.widths[0] if spec.input_requires_grad else 0
    grads += sum(2 * spec.widths[i] for i, trainable in enumerate(trainable_norms(spec)) if trainable)  # scale, shift
    activation = rows * max(spec.widths)
    in_flight = 2 + any(norm_layers(spec)) + any(activated_layers(spec))  # + a norm's output, an activation's
    # A layer's backward returns its wgrad and bgrad together, so one replay temporary is weight + bias sized.
    bias = 1 if spec.has_bias else 0
    weight_temp = max(spec.widths[i] * spec.widths[i + 1] + bias * spec.widths[i + 1]
                      for i in range(spec.n_layers)) if spec.replays > 1 else 0
    output = rows * spec.widths[-1]
    recompute = working_elements(spec, sites(spec))
    return required_saved(spec).nbytes + size * (output + grads + in_flight * activation + weight_temp + recompute) + _cast_peak(spec)


def _cast_peak(spec: CaseSpec) -> int:
    """Under autocast, the forward's cast copies of weights and biases: autocast caches the casts of trainable leaves
    for the whole region (every trainable layer's at once), and a frozen layer's lives while its GEMM runs (the largest
    one); 0 without autocast."""
    if not spec.autocast:
        return 0
    weights, biases = trainable_masks(spec)
    sizes = [(spec.widths[i] * spec.widths[i + 1], spec.widths[i + 1] if spec.has_bias else 0)
             for i in range(spec.n_layers)]
    cached = sum(w * weights[i] + b * biases[i] for i, (w, b) in enumerate(sizes))
    in_flight = max((w * (not weights[i]) + b * (not biases[i]) for i, (w, b) in enumerate(sizes)), default=0)
    return BYTES_PER_ELEMENT[compute_dtype(spec)] * (cached + in_flight)


def te_sites(spec: CaseSpec) -> list[str]:
    """Labels of the sites that are TE Linears: every adapter's base (model.te_base), in any family's naming: a
    site "P.<name>" that is no adapter, beside adapters "P.lora_..." (ours "q.base" / "q.lora_a", peft's
    "q_proj.base_layer" / "q_proj.lora_A.default", LitGPT's "qkv.linear" / "qkv.lora_A")."""
    if spec.model is None or not spec.model.te_base:
        return []
    labels = [s.label for s in sites(spec)]
    adapters = [label.lower() for label in labels if ".lora_" in label.lower()]
    return [label for label in labels if ".lora_" not in label.lower()
            and any(a.startswith(label.rsplit(".", 1)[0].lower() + ".lora_") for a in adapters)]
