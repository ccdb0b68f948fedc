"""Linear sites of a model torch.fx cannot trace, read from its torch.export graph (non-strict: the model's own
Python runs, on fake tensors, so data-dependent control flow and shape checks are taken as they fall).

The rule is oracle.graph's per aten op, on an op-level graph:
- placeholders: a parameter needs a gradient iff it is trainable (freezing as it stands), a buffer or constant
  never, the user input iff the case's input does; any other op's output iff one of its tensor arguments does;
- a site is a GEMM call with a site's weight (oracle.sites.linear_weights: a Linear's weight or a marked matrix
  Parameter) as an operand, reached through views: `aten.linear` (every Linear; peft's adapters; LitGPT's fused-qkv
  `F.linear(x, lora_A)`), `aten.matmul` (LitGPT's `x @ lora_A.T @ lora_B.T`) and a kernel-size-1 `aten.conv1d`
  (LitGPT's fused-qkv lora_B, one GEMM per group); its rows are the input's positions, its fan-in the reduced
  dimension (a group's channels for the convolution), its fan-out the output's features;
- each site is named by its weight's label and numbered in module order; the module path it was called from
  (`nn_module_stack`) must contain that weight, else the graph and the model disagree and the oracle refuses.
A site's input value is the value it reads with views looked through (LitGPT's convolution reads a transpose of
lora_A's output), so sites reading one value save it once.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from te_verify.oracle.sites import Site, linear_weights

aten = torch.ops.aten
# Ops that return a view (or the same values) of their first argument: looked through to find what a site reads.
# (Not reshape or contiguous: they copy where the layout asks for it, and a copy is a value of its own.)
VIEWS = frozenset({aten.t.default, aten.numpy_T.default, aten.transpose.int, aten.permute.default,
                   aten.unsqueeze.default, aten.squeeze.dim, aten.view.default, aten.expand.default,
                   aten.alias.default, aten.detach.default})
GEMMS = frozenset({aten.linear.default, aten.matmul.default, aten.conv1d.default})


class ExportGraphError(RuntimeError):
    """The export graph does not match the model; one line names the op and the module."""


def root(node: Any) -> Any:
    """The value a node views (itself if it is not a view)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in VIEWS:
        node = node.args[0]
    return node


def _needs(args: Any, needs: dict[str, bool]) -> bool:
    found = []
    torch.fx.map_arg(args, lambda n: found.append(needs.get(n.name, False)))
    return any(found)


def export_sites(model: torch.nn.Module, example_input: torch.Tensor) -> list[Site]:
    """Every linear site of `model` (freezing as it stands) called on `example_input`, in module order."""
    program = torch.export.export(model, (example_input.detach(),), strict=False)
    signature = program.graph_signature
    params = dict(model.named_parameters())
    labels = {id(site.weight): (site.label, k) for k, site in enumerate(linear_weights(model))}
    placeholder_params = {name: params[fqn] for name, fqn in signature.inputs_to_parameters.items()}
    user_inputs = set(signature.user_inputs)
    needs: dict[str, bool] = {}
    found = []
    for node in program.graph.nodes:
        if node.op == "placeholder":
            p = placeholder_params.get(node.name)
            needs[node.name] = bool(p.requires_grad) if p is not None else (
                node.name in user_inputs and example_input.requires_grad)
        elif node.op == "call_function":
            needs[node.name] = _needs((node.args, node.kwargs), needs)
            if node.target in GEMMS:
                site = _site(node, placeholder_params, labels, needs, user_inputs)
                if site is not None:
                    found.append(site)
    return sorted(found, key=lambda s: s.layer)


def _weight_of(node: torch.fx.Node, placeholder_params: dict, labels: dict) -> tuple[int, Any] | None:
    """(operand position, Parameter) of the site weight among a GEMM call's two operands, if one is."""
    for slot in (1, 0):
        source = root(node.args[slot])
        p = placeholder_params.get(source.name) if isinstance(source, torch.fx.Node) else None
        if p is not None and id(p) in labels:
            return slot, p
    return None


def _site(node: torch.fx.Node, placeholder_params: dict, labels: dict, needs: dict[str, bool],
          user_inputs: set[str]) -> Site | None:
    found = _weight_of(node, placeholder_params, labels)
    if found is None:
        return None  # attention's matmuls, or a GEMM on a matrix that is no site
    slot, weight = found
    label, layer = labels[id(weight)]
    _check_module(node, label)
    source = node.args[1 - slot]
    shape, out = tuple(source.meta["val"].shape), tuple(node.meta["val"].shape)
    if node.target is aten.conv1d.default:  # (batch, channels, positions) in and out; groups split the channels
        groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
        rows, fan_in, fan_out = shape[0] * shape[2], shape[1] // groups, out[1]
    else:
        rows, fan_in, fan_out = math.prod(shape[:-1]), shape[-1], out[-1]
    bias = root(node.args[2]) if node.target is aten.linear.default and len(node.args) > 2 else None
    bias_param = placeholder_params.get(bias.name) if isinstance(bias, torch.fx.Node) else None
    value = root(source)
    return Site(label, layer, rows, fan_in, fan_out, bool(weight.requires_grad),
                bool(bias_param is not None and bias_param.requires_grad), needs.get(source.name, False),
                value.name, value.op == "placeholder" and value.name in user_inputs)


def _check_module(node: torch.fx.Node, label: str) -> None:
    """The module the op was called from holds the weight: a Linear is the weight's module itself, a marked
    matrix's module is its owner."""
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else ""
    if not (label == path or label.startswith(f"{path}.") or not path):
        raise ExportGraphError(f"export graph: {node.target} in module {path!r} multiplies site {label!r}'s weight, "
                               f"which that module does not hold")
