"""te_eager: the model's nn.Linear stack rebuilt from TE modules of the active --te-impl, run eagerly under TE's
autocast with the spec's recipe (outside autocast without one). The TE modules hold the model's own Parameters.

Module kinds (spec.te.module), one builder each in KINDS: "linear" (te.Linear per layer), "grouped_linear"
(te.GroupedLinear with one group per layer), "ops_linear" (te.ops.Linear), "ops_grouped_linear"
(te.ops.GroupedLinear, one group), "grouped_mlp" (the reference's fused grouped MLP per pair of layers),
"layernorm_linear" (te.LayerNormLinear per models.normed layer, its norm's Parameters shared too),
"layernorm_mlp" (te.LayerNormMLP per pair of models.normed layers, NormedLinear fc1 and ActivatedLinear fc2). With
spec.te.main_grad each trainable weight gets an fp32 `main_grad` buffer, `zero_out_wgrad=True`, and
(grad_added_to_main_grad) the Megatron flag. A model family with LoRA over TE (spec.model.te_base) keeps its
modules and turns every adapter's base torch Linear into a TE Linear holding the same Parameter (TEFamily), so the
torch reference and the TE run start bit-identical; the adapters stay torch Linears. TE's modules are made on the
run's device (te_verify.device), like the model whose Parameters they hold; an implementation that cannot run there skips with its reason.
With spec.recompute each pair of TE modules (models.recompute.regions) runs under torch's checkpoint or TE's own
(`distributed.checkpoint` of the --te-impl: te_checkpoint), inside TE's autocast as users call it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch

from te_verify import device as run_device
from te_verify.compat import te_checkpoint_cpu
from te_verify.models.recompute import regions, run_block
from te_verify.te import api as te_api
from te_verify.spec import REENTRANT_MODES, TE_RECOMPUTE_MODES, CaseSpec, TEConfig


def fp8_skip_reason(spec: CaseSpec, impl: te_api.TEImpl) -> str | None:
    """TE's own reason when the spec needs FP8 and this device lacks it, or the recipe's format (a block-scaled
    recipe's GEMMs: te_api.recipe_reason)."""
    if spec.te is None or spec.te.recipe is None:
        return None
    ok, reason = impl.api.is_fp8_available(return_reason=True)
    if not ok:
        return f"FP8 unavailable: {reason}"
    reason = te_api.recipe_reason(impl.api, spec.te.recipe, spec.te.qfactory)
    return f"--te-impl {impl.name}: {reason}" if reason else None


def attach_main_grad(model: torch.nn.Module, te: TEConfig) -> None:
    """The Megatron protocol attributes on every trainable weight."""
    for name, p in model.named_parameters():
        if name.endswith("weight") and p.requires_grad:
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            p.zero_out_wgrad = True
            if te.grad_added_to_main_grad:
                p.grad_added_to_main_grad = False


@dataclass(frozen=True)
class Kind:
    """How one module kind is built from a layer (or pair) and called."""

    # (api, layers, te config, dtype, name) -> the TE module holding the layers' Parameters.
    build: Callable
    # Layers per module: 1, or 2 for the fused MLP.
    layers: int
    # (module, 2-D rows, is_first_microbatch) -> output rows.
    call: Callable
    # The API name of the class it builds, as a skip reason names it when the --te-impl lacks it.
    needs: str
    # api -> the class the kind constructs (None where the --te-impl lacks it).
    cls: Callable
    # Its constructor keyword for accumulating the weight gradient into main_grad (Megatron's protocol).
    main_grad_kw: str = "fuse_wgrad_accumulation"


def _share(module: torch.nn.Module, pairs: dict[str, torch.nn.Parameter | None]) -> torch.nn.Module:
    for attr, param in pairs.items():
        setattr(module, attr, param)
    return module


def _module_kw(cls: type, te: TEConfig, dtype: torch.dtype, name: str) -> dict:
    # The main_grad and delayed-wgrad keywords only where the case uses them (False is TE's default), and `name`
    # (a label for TE's debug tools and the reference's log) where taken, so a user's build without them serves the
    # cases that do not need them (missing_api skips the others, naming what is missing).
    return dict(params_dtype=dtype, device=run_device.active(),
                **({"name": name} if te_api.accepts(cls, "name") else {}),
                **({"fuse_wgrad_accumulation": True} if te.main_grad else {}),
                **({"delay_wgrad_compute": True} if te.delay_wgrad else {}))


def _linear(api, ls, te, dtype, name):
    (l,) = ls
    return _share(api.Linear(l.in_features, l.out_features, bias=l.bias is not None,
                             **_module_kw(api.Linear, te, dtype, name)), {"weight": l.weight, "bias": l.bias})


def _experts_of(layer: torch.nn.Module) -> list[torch.nn.Linear]:
    return getattr(layer, "experts", [layer])


def _group_params(layer: torch.nn.Module) -> dict[str, torch.nn.Parameter | None]:
    """weight<k>/bias<k> of a grouped module, one group per expert."""
    pairs = {}
    for k, expert in enumerate(_experts_of(layer)):
        pairs.update({f"weight{k}": expert.weight, f"bias{k}": expert.bias})
    return pairs


def _grouped_linear(api, ls, te, dtype, name):
    (l,) = ls
    e = _experts_of(l)[0]
    module = api.GroupedLinear(te.experts, e.in_features, e.out_features, bias=e.bias is not None,
                               **_module_kw(api.GroupedLinear, te, dtype, name))
    return _share(module, _group_params(l))


def _ops_linear(api, ls, te, dtype, name):
    (l,) = ls
    op = api.ops.Linear(l.in_features, l.out_features, bias=l.bias is not None, dtype=dtype,
                        device=run_device.active(), accumulate_into_main_grad=te.main_grad)
    _share(op.basic_ops[0], {"weight": l.weight})
    if l.bias is not None:
        _share(op.basic_ops[1], {"bias": l.bias})
    return op


def _ops_grouped_linear(api, ls, te, dtype, name):
    (l,) = ls
    e = _experts_of(l)[0]
    op = api.ops.GroupedLinear(te.experts, e.in_features, e.out_features, bias=e.bias is not None, dtype=dtype,
                               device=run_device.active(), accumulate_into_main_grad=te.main_grad,
                               delay_wgrad_compute=te.delay_wgrad)
    return _share(op, _group_params(l))


def _splits(x: torch.Tensor, groups: int) -> list[int]:
    return [x.shape[0] // groups] * groups


def _split_tensor(x: torch.Tensor, groups: int) -> torch.Tensor:
    """te.ops GroupedLinear's split sizes, on the input's device (TE's grouped-tensor path requires CUDA ones)."""
    return torch.tensor(_splits(x, groups), dtype=torch.int64, device=x.device)


def _grouped_mlp(api, ls, te, dtype, name):
    l1, l2 = ls
    module = api.GroupedMLP(1, l1.in_features, l1.out_features, l2.out_features, bias=l1.bias is not None,
                            **_module_kw(api.GroupedMLP, te, dtype, name))
    return _share(module, {"fc1_weight0": l1.weight, "fc2_weight0": l2.weight, "fc1_bias0": l1.bias, "fc2_bias0": l2.bias})


def _layernorm_linear(api, ls, te, dtype, name):
    """TE's LayerNormLinear holding a NormedLinear's (models.normed) Parameters, its norm's included."""
    (l,) = ls
    module = api.LayerNormLinear(l.in_features, l.out_features, eps=l.norm.eps, bias=l.bias is not None,
                                 **_module_kw(api.LayerNormLinear, te, dtype, name))
    return _share(module, {"weight": l.weight, "bias": l.bias, "layer_norm_weight": l.norm.weight,
                           "layer_norm_bias": l.norm.bias})


def _layernorm_mlp(api, ls, te, dtype, name):
    """TE's LayerNormMLP with te.activation holding a NormedLinear's (fc1, its norm) and an ActivatedLinear's (fc2)
    Parameters; TE keeps an empty tensor, no Parameter, for the biases of a stack without them."""
    l1, l2 = ls
    module = api.LayerNormMLP(l1.in_features, l1.out_features, eps=l1.norm.eps, bias=l1.bias is not None,
                              activation=te.activation, **_module_kw(api.LayerNormMLP, te, dtype, name))
    biases = {"fc1_bias": l1.bias, "fc2_bias": l2.bias} if l1.bias is not None else {}
    return _share(module, {"fc1_weight": l1.weight, "fc2_weight": l2.weight, "layer_norm_weight": l1.norm.weight,
                           "layer_norm_bias": l1.norm.bias, **biases})


def _ops_class(name: str) -> Callable:
    return lambda api: getattr(api.ops, name, None) if api.ops is not None else None


def _first_microbatch(module: torch.nn.Module, flag: bool | None) -> dict:
    """is_first_microbatch for a module whose forward takes it, when the caller passes one."""
    return {"is_first_microbatch": flag} if flag is not None and te_api.accepts(module.forward, "is_first_microbatch") else {}


KINDS: dict[str, Kind] = {
    "linear": Kind(_linear, 1, lambda m, x, f: m(x, **_first_microbatch(m, f)), "Linear", lambda api: api.Linear),
    "grouped_linear": Kind(_grouped_linear, 1, lambda m, x, f: m(x, _splits(x, m.num_gemms), **_first_microbatch(m, f)),
                           "GroupedLinear", lambda api: api.GroupedLinear),
    "ops_linear": Kind(_ops_linear, 1, lambda m, x, f: m(x), "ops.Linear", _ops_class("Linear"),
                       "accumulate_into_main_grad"),
    "ops_grouped_linear": Kind(_ops_grouped_linear, 1, lambda m, x, f: m(x, _split_tensor(x, m.num_groups)),
                               "ops.GroupedLinear", _ops_class("GroupedLinear"), "accumulate_into_main_grad"),
    "grouped_mlp": Kind(_grouped_mlp, 2, lambda m, x, f: m(x, [x.shape[0]]), "GroupedMLP", lambda api: api.GroupedMLP),
    "layernorm_linear": Kind(_layernorm_linear, 1, lambda m, x, f: m(x, **_first_microbatch(m, f)), "LayerNormLinear",
                             lambda api: getattr(api, "LayerNormLinear", None)),
    "layernorm_mlp": Kind(_layernorm_mlp, 2, lambda m, x, f: m(x, **_first_microbatch(m, f)), "LayerNormMLP",
                          lambda api: getattr(api, "LayerNormMLP", None)),
}


def missing_api(spec: CaseSpec, api: SimpleNamespace) -> list[str]:
    """The parts of TE's API the case uses that `api` lacks (empty when it serves the case): the module kind's class,
    main_grad accumulation (te.main_grad), backward_dw (te.delay_wgrad), Format (a recipe's fp8_format). Read
    from the classes' attributes and signatures, without building anything."""
    te = spec.te or TEConfig()
    kind = KINDS[te.module]
    cls = kind.cls(api)
    if cls is None:
        return [f"te.{kind.needs}"]
    missing = []
    if te.main_grad and not te_api.accepts(cls, kind.main_grad_kw):
        missing.append(f"main_grad ({kind.needs}({kind.main_grad_kw}=True))")
    delayed = callable(getattr(cls, "backward_dw", None)) and te_api.accepts(cls, "delay_wgrad_compute")
    if te.delay_wgrad and not delayed:
        missing.append(f"{kind.needs}.backward_dw with delay_wgrad_compute=True")
    if te.recipe is not None and api.Format is None:
        missing.append(f"Format (the recipe's fp8_format={te.fp8_format})")
    if spec.recompute in TE_RECOMPUTE_MODES and _te_checkpoint_of(api) is None:
        missing.append("distributed.checkpoint")
    return missing


def _te_checkpoint_of(api: SimpleNamespace) -> Callable | None:
    return getattr(getattr(api.module, "distributed", None), "checkpoint", None)


def te_checkpoint(impl: te_api.TEImpl) -> Callable:
    """The --te-impl's `distributed.checkpoint`; for the CPU run of TE's Python, with the CPU RNG step it needs there
    (compat.te_checkpoint_cpu)."""
    if impl.kind == te_api.EMULATED and not torch.cuda.is_available():
        te_checkpoint_cpu.apply()
    return _te_checkpoint_of(impl.api)


class TEStack(torch.nn.Module):
    """The converted layers plus how to call them; backward_dw() runs every module's queued wgrads."""

    def __init__(self, modules: list[torch.nn.Module], kind: Kind, api: SimpleNamespace, recipe,
                 recompute: str = "none", checkpoint: Callable | None = None) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(modules)
        self.kind, self.api, self.recipe = kind, api, recipe
        # CaseSpec.recompute, and TE's checkpoint for its modes (te_checkpoint).
        self.recompute, self.checkpoint = recompute, checkpoint

    def forward(self, x: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        """`is_first_microbatch` reaches every module that takes it (TE's Linear and GroupedLinear: True makes and
        keeps the FP8 weight copy, False reuses it; None, the default, makes it anew every call)."""
        # No recipe: outside autocast, as a user running TE without FP8 would.
        with self.api.autocast(enabled=True, recipe=self.recipe) if self.recipe else contextlib.nullcontext():
            lead = x.shape[:-1]
            rows = x.reshape(-1, x.shape[-1])
            for block in regions(len(self.layers)):
                rows = self._run_block([self.layers[i] for i in block], rows, is_first_microbatch)
        return rows.reshape(*lead, -1)

    def _run_block(self, layers: list[torch.nn.Module], rows: torch.Tensor, flag: bool | None) -> torch.Tensor:
        """One block of layers, checkpointed as spec.recompute says."""
        def block(h: torch.Tensor) -> torch.Tensor:
            for layer in layers:
                h = self.kind.call(layer, h, flag)
            return h

        if self.recompute in TE_RECOMPUTE_MODES:
            return self.checkpoint(block, rows, use_reentrant=self.recompute in REENTRANT_MODES)
        return run_block(self.recompute, block, rows)

    def backward_dw(self) -> None:
        for layer in self.layers:
            if hasattr(layer, "backward_dw"):
                layer.backward_dw()


def convert(model: torch.nn.Sequential, spec: CaseSpec, api: SimpleNamespace) -> list[torch.nn.Module]:
    """TE-API modules for the stack, sharing its Parameters; names match the model's layer names."""
    te = spec.te or TEConfig()
    kind = KINDS[te.module]
    dtype = next(model.parameters()).dtype
    layers = list(model.named_children())
    groups = [layers[i:i + kind.layers] for i in range(0, len(layers), kind.layers)]
    return [kind.build(api, [l for _, l in group], te, dtype, "+".join(n for n, _ in group)) for group in groups]


def convert_family(model: torch.nn.Module, spec: CaseSpec, api: SimpleNamespace,
                   extra_sites: tuple[str, ...] = ()) -> torch.nn.Module:
    """Every LoRA adapter's base (a torch Linear; oracle.required.te_sites names them in any family), and the torch
    Linears labelled in `extra_sites`, replaced in place by a TE Linear of `api` holding its Parameters and named by
    its qualified name; returns `model`."""
    from te_verify.oracle.required import te_sites

    te = spec.te or TEConfig()
    for label in [*te_sites(spec), *extra_sites]:
        parent, _, attr = label.rpartition(".")
        base = model.get_submodule(label)
        setattr(model.get_submodule(parent), attr, _linear(api, [base], te, base.weight.dtype, label))
    return model


class TEFamily(torch.nn.Module):
    """A model family whose adapters' bases are TE Linears, called under TE's autocast with the recipe (outside
    autocast without one)."""

    def __init__(self, model: torch.nn.Module, api: SimpleNamespace, recipe) -> None:
        super().__init__()
        self.model, self.api, self.recipe = model, api, recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.api.autocast(enabled=True, recipe=self.recipe) if self.recipe else contextlib.nullcontext():
            return self.model(x)


class TEEagerBackend:
    """TE modules of the active --te-impl (te_api.active()), eager."""

    name = "te_eager"
    lane = "te"

    def __init__(self, extra_sites: tuple[str, ...] = ()) -> None:
        # Linears of a model family run as TE Linears besides its TE sites (convert_family): those another
        # backend quantized, for the same-quantization reference judging it (te_case.fp8_judged_against).
        self.extra_sites = tuple(extra_sites)

    @property
    def impl(self) -> te_api.TEImpl:
        """The active --te-impl, read at use (the plugin may activate it after constructing backends)."""
        return te_api.active()

    def available(self) -> tuple[bool, str]:
        # te_api.resolve already refused an implementation that cannot run on this machine; the device may not fit.
        reason = te_api.device_reason(self.impl, run_device.active())
        return (False, reason) if reason else (True, "")

    def unsupported_reason(self, spec: CaseSpec) -> str | None:
        """Why this backend cannot run `spec` here (None if it can)."""
        te = spec.te or TEConfig()
        kind = KINDS[te.module]
        if spec.model is not None and (te.module != "linear" or te.main_grad or te.delay_wgrad or te.tied
                                       or te.experts > 1 or te.microbatches > 1):
            return f"a model family runs its adapters' bases as plain TE Linears, not {te.tag}"
        if spec.n_layers % kind.layers:
            return f"{te.module} pairs layers: needs an even number of layers"
        if te.module == "ops_linear" and te.delay_wgrad:
            return "te.ops.Linear has no delay_wgrad_compute"
        if spec.recompute != "none" and not self.impl.runs_te_python:  # unmeasured: the reference logs its own saves
            return (f"activation recompute over --te-impl {self.impl.name} is not built yet (its saved-copy log and "
                    f"aten GEMMs under a checkpoint are unmeasured; issue 34: TE's Python only)")
        # FP8 first: a build without FP8 skips its FP8 cases for that, not for an FP8 API it has no use for.
        missing = missing_api(spec, self.impl.api)
        return fp8_skip_reason(spec, self.impl) or (
            f"--te-impl {self.impl.name} lacks {', '.join(missing)} (module kind {te.module})" if missing else None)

    def prepare(self, model: torch.nn.Module, spec: CaseSpec) -> TEStack:
        api = self.impl.api
        te = spec.te or TEConfig()
        if te.main_grad:
            attach_main_grad(model, te)
        recipe = te_api.case_recipe(api, te)
        if spec.model is not None:
            return TEFamily(convert_family(model, spec, api, self.extra_sites), api, recipe)
        checkpoint = te_checkpoint(self.impl) if spec.recompute in TE_RECOMPUTE_MODES else None
        return TEStack(convert(model, spec, api), KINDS[te.module], api, recipe, spec.recompute, checkpoint)


def skip_unsupported(case) -> None:
    """pytest.skip with the backend's own reason when it cannot run the case's spec here."""
    import pytest

    reason = getattr(case.backend, "unsupported_reason", lambda spec: None)(case.spec)
    if reason:
        pytest.skip(reason)
