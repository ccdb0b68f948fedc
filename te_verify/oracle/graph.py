"""Linear sites of any model, read from its module graph (torch.fx) and which values need a gradient.

The oracle's rules hold per linear site whatever surrounds it: fprop always; dgrad iff the site's input needs a
gradient; wgrad iff its weight is trainable; its input saved iff wgrad is needed. What a stack index said for
the linear stack, the graph says here: a value needs a gradient iff the model input does and reaches it, or a
trainable parameter (of a linear, a norm, an embedding) is upstream of it. Propagated over the traced graph:
- placeholder: the spec's input_requires_grad; get_attr: the parameter's requires_grad;
- a leaf module call (Linear, Embedding, TE's Linear): any input needs grad, or one of its parameters trains;
- any other call: any tensor argument needs grad.
Sites are numbered in the model's module order, the order the probes bind weights in (`linear_weights`), and
named by their qualified module names. Rows come from the shapes (fx's ShapeProp on the real input). A model fx
cannot trace is read from its torch.export graph instead (te_verify/oracle/export.py).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp

from te_verify.oracle.sites import Site, is_linear, linear_weights


class _Tracer(torch.fx.Tracer):
    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return is_linear(m) or super().is_leaf_module(m, qualname)


def _trains(module: torch.nn.Module, name: str) -> bool:
    p = getattr(module, name, None)
    return isinstance(p, torch.Tensor) and p.requires_grad


def _needs(arg: Any, needs: dict[str, bool]) -> bool:
    found = []
    torch.fx.map_arg(arg, lambda n: found.append(needs.get(n.name, False)))
    return any(found)


def graph_sites(model: torch.nn.Module, example_input: torch.Tensor) -> list[Site]:
    """Every linear site of `model` (freezing as it stands) called on `example_input`, in module order: from its
    torch.fx module graph, or where torch.fx cannot trace the model (transformers' masking, LitGPT's shape checks)
    from its torch.export graph (te_verify.oracle.export: the same rule per aten op)."""
    try:
        graph = _Tracer().trace(model)
    except Exception:  # fx raises TraceError, TypeError, ... wherever Python reads a traced value
        from te_verify.oracle.export import export_sites

        return export_sites(model, example_input)
    return fx_sites(model, graph, example_input)


def fx_sites(model: torch.nn.Module, graph: torch.fx.Graph, example_input: torch.Tensor) -> list[Site]:
    """The sites of a traced module graph (linear modules as leaves)."""
    graph_module = torch.fx.GraphModule(model, graph)
    ShapeProp(graph_module).propagate(example_input.detach())
    modules = dict(model.named_modules())
    order = {site.label: k for k, site in enumerate(linear_weights(model))}
    needs: dict[str, bool] = {}
    found = []
    for node in graph_module.graph.nodes:
        if node.op == "placeholder":
            needs[node.name] = example_input.requires_grad
        elif node.op == "get_attr":
            needs[node.name] = bool(graph_module.get_parameter(node.target).requires_grad)
        elif node.op == "call_module":
            module = modules[node.target]
            upstream = _needs(node.args, needs)
            needs[node.name] = upstream or any(p.requires_grad for p in module.parameters())
            if is_linear(module):
                found.append(_site(node, module, order[node.target], upstream))
        else:
            needs[node.name] = _needs((node.args, node.kwargs), needs)
    return sorted(found, key=lambda s: s.layer)


def _site(node: torch.fx.Node, module: torch.nn.Module, index: int, upstream: bool) -> Site:
    """The oracle's Site for one linear call: named by its module, numbered in module order, reading `source`."""
    source = node.args[0]
    shape = source.meta["tensor_meta"].shape
    return Site(node.target, index, math.prod(shape[:-1]), module.in_features, module.out_features,
                _trains(module, "weight"), _trains(module, "bias"), upstream, source.name, source.op == "placeholder")
