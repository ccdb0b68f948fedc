"""te_eager: the model's nn.Linear stack rebuilt from TE-API modules of the active --te-impl, run eagerly
under autocast with the spec's recipe. The TE modules hold the model's own Parameter objects.

Module kinds: "linear" (one Linear per layer), "grouped_linear" (one GroupedLinear with a single group per
layer), "grouped_mlp" (one GroupedMLP, identity activation, per pair of layers). With spec.te.main_grad
each trainable weight gets an fp32 `main_grad` buffer, `zero_out_wgrad=True`, and (grad_added_to_main_grad)
the Megatron flag.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from te_verify import te_api
from te_verify.spec import CaseSpec, TEConfig


def fp8_skip_reason(spec: CaseSpec, impl: te_api.TEImpl) -> str | None:
    """TE's own reason when the spec needs FP8 and this device lacks it."""
    if spec.te is None or spec.te.recipe is None:
        return None
    ok, reason = impl.api.is_fp8_available(return_reason=True)
    return None if ok else f"FP8 unavailable: {reason}"


def attach_main_grad(model: torch.nn.Module, te: TEConfig) -> None:
    """The Megatron protocol attributes on every trainable weight."""
    for name, p in model.named_parameters():
        if name.endswith("weight") and p.requires_grad:
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
            p.zero_out_wgrad = True
            if te.grad_added_to_main_grad:
                p.grad_added_to_main_grad = False


class TEStack(torch.nn.Module):
    """The converted layers plus how to call them; backward_dw() runs every module's queued wgrads."""

    def __init__(self, modules: list[torch.nn.Module], grouped: bool, api: SimpleNamespace, recipe) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(modules)
        self.grouped, self.api, self.recipe = grouped, api, recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.api.autocast(enabled=self.recipe is not None, recipe=self.recipe):
            for layer in self.layers:
                if self.grouped:
                    rows = x.reshape(-1, x.shape[-1])
                    x = layer(rows, [rows.shape[0]]).reshape(*x.shape[:-1], -1)
                else:
                    x = layer(x)
        return x

    def backward_dw(self) -> None:
        for layer in self.layers:
            if hasattr(layer, "backward_dw"):
                layer.backward_dw()


def _share(te_module: torch.nn.Module, pairs: dict[str, torch.nn.Parameter | None]) -> torch.nn.Module:
    for attr, param in pairs.items():
        setattr(te_module, attr, param)
    return te_module


def convert(model: torch.nn.Sequential, spec: CaseSpec, api: SimpleNamespace) -> list[torch.nn.Module]:
    """TE-API modules for the stack, sharing its Parameters; names match the model's layer names."""
    te = spec.te or TEConfig()
    kw = dict(fuse_wgrad_accumulation=te.main_grad, delay_wgrad_compute=te.delay_wgrad,
              params_dtype=next(model.parameters()).dtype)
    layers = list(model.named_children())
    if te.module == "linear":
        return [_share(api.Linear(l.in_features, l.out_features, bias=l.bias is not None, name=n, **kw),
                       {"weight": l.weight, "bias": l.bias}) for n, l in layers]
    if te.module == "grouped_linear":
        mods = []
        for n, l in layers:
            mod = _share(api.GroupedLinear(1, l.in_features, l.out_features, bias=l.bias is not None, name=n, **kw),
                         {"weight0": l.weight, "bias0": l.bias})
            mods.append(mod)
        return mods
    mods = []
    for (n1, l1), (n2, l2) in zip(layers[::2], layers[1::2]):
        mod = api.GroupedMLP(1, l1.in_features, l1.out_features, l2.out_features, bias=l1.bias is not None,
                             name=f"{n1}+{n2}", **kw)
        mod.fc1_name, mod.fc2_name = n1, n2
        mods.append(_share(mod, {"fc1_weight0": l1.weight, "fc2_weight0": l2.weight,
                                 "fc1_bias0": l1.bias, "fc2_bias0": l2.bias}))
    return mods


class TEEagerBackend:
    """TE modules of the active --te-impl (te_api.active()), eager."""

    name = "te_eager"
    lane = "te"

    @property
    def impl(self) -> te_api.TEImpl:
        """The active --te-impl, read at use (the plugin may activate it after constructing backends)."""
        return te_api.active()

    def available(self) -> tuple[bool, str]:
        if not self.impl.is_reference_runtime and not torch.cuda.is_available():
            return False, "transformer_engine needs a CUDA device"
        return True, ""

    def unsupported_reason(self, spec: CaseSpec) -> str | None:
        """Why this backend cannot run `spec` here (None if it can)."""
        module = spec.te.module if spec.te else "linear"
        if module == "grouped_mlp" and self.impl.api.GroupedMLP is None:
            return f"--te-impl {self.impl.name} serves no GroupedMLP module"
        if module == "grouped_mlp" and spec.n_layers % 2:
            return "grouped_mlp pairs layers: needs an even number of layers"
        return fp8_skip_reason(spec, self.impl)

    def prepare(self, model: torch.nn.Module, spec: CaseSpec) -> TEStack:
        api = self.impl.api
        te = spec.te or TEConfig()
        if te.main_grad:
            attach_main_grad(model, te)
        recipe = te_api.make_recipe(api, te.recipe, te.fp8_format)
        return TEStack(convert(model, spec, api), te.module != "linear", api, recipe)


def skip_unsupported(case) -> None:
    """pytest.skip with the backend's own reason when it cannot run the case's spec here."""
    import pytest

    reason = getattr(case.backend, "unsupported_reason", lambda spec: None)(case.spec)
    if reason:
        pytest.skip(reason)
