"""Backends that waste only from the second iteration on (issue 36, item 1), each with a clean twin.

A compiler that recompiles once the parameters change (an optimizer step bumps every trained parameter's version)
and loses its requires_grad specialisation in the new graph: from its first call after a step, the frozen layers'
inputs are saved and their weight gradients computed, then dropped (waste_planted's "discarded_wgrad"). Iteration 1
is as eager's, so a check judged on iteration 1 alone passes it. Its twin recompiles too, to a correct graph written
differently from eager (waste_planted's split-K Linear: each GEMM as two half-K GEMMs)."""
from __future__ import annotations

import torch

from waste_planted import _PlantedLinear, _SplitKLinear
from te_verify.spec import CaseSpec


def stepped(model: torch.nn.Module) -> "callable":
    """Whether any parameter changed in place since now (an optimizer step, or a harness copying parameters in)."""
    versions = {name: p._version for name, p in model.named_parameters()}
    return lambda: any(p._version != versions[name] for name, p in model.named_parameters())


class _Recompiles:
    """Runs each layer through the 'first graph' until the parameters change, then through the 'recompiled' one."""

    lane = "torch"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        changed = stepped(model)

        def run(x: torch.Tensor) -> torch.Tensor:
            layer_fn = self.recompiled if changed() else self.first
            for layer in model:
                x = layer_fn(x, layer)
            return x

        return run

    @staticmethod
    def first(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        return _PlantedLinear.apply(x, layer.weight, layer.bias, frozenset())


class LosesFrozenAfterStep(_Recompiles):
    """From the first call after a step: every frozen layer's input saved and its wgrad computed and dropped."""

    name = "planted_loses_frozen_after_step"

    @staticmethod
    def recompiled(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        return _PlantedLinear.apply(x, layer.weight, layer.bias, frozenset({"discarded_wgrad"}))


class RecompilesCorrectly(_Recompiles):
    """The clean twin: recompiled to split-K GEMMs, the same FLOPs and saves."""

    name = "recompiles_correctly"

    @staticmethod
    def recompiled(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        return _SplitKLinear.apply(x, layer.weight, layer.bias)


def _dp_switching_after_first_call(model: torch.nn.Module, spec: CaseSpec, frozen_too: bool):
    """A hand-written data-parallel wrapper (grad_divisor 1) that, on its first call, sums each trainable
    parameter's gradient over the ranks from a post-accumulate hook and, from its second call on (its 'recompiled'
    path), all-reduces them at the end of backward instead; with `frozen_too` that path also all-reduces a flat copy of
    the frozen parameters (a sync nothing needs, named by its content)."""
    import torch.distributed as dist

    from te_verify.distributed.types import Wrapped, grad_of, param_slots, param_tensors, units_of, value_of

    slots, layers, calls = param_slots(model), units_of(model, spec), [0]
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in trainable:
        p.register_post_accumulate_grad_hook(lambda q: dist.all_reduce(q.grad) if calls[0] == 1 else None)

    def end_of_backward() -> None:
        for p in trainable:
            dist.all_reduce(p.grad)
        if frozen_too and frozen:
            dist.all_reduce(torch.cat([p.detach().reshape(-1) for p in frozen]))

    def forward(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        out = model(x)
        if calls[0] > 1:
            engine = torch.autograd.Variable._execution_engine
            out.register_hook(lambda g: engine.queue_callback(end_of_backward) and None)
        return out

    return Wrapped(forward, layers, lambda: param_tensors(slots, grad_of), lambda: param_tensors(slots, value_of),
                   lambda: [0] * len(layers), 1.0)


def dp_syncing_frozen_after_first_call(model, spec):
    """Planted: from its second call on, every backward also all-reduces the frozen parameters."""
    return _dp_switching_after_first_call(model, spec, frozen_too=True)


def dp_switching_correctly_after_first_call(model, spec):
    """The clean twin: from its second call on, the trainable gradients reduced at the end of backward, nothing more."""
    return _dp_switching_after_first_call(model, spec, frozen_too=False)


class KeepsOutputsFromThirdIteration(_Recompiles):
    """Eager's math through custom autograd (no faults); from the third parameter version it sees on (iteration 3,
    after two optimizer steps), it keeps a copy of every output: memory that grows from then on only."""

    name = "planted_keeps_outputs_from_iteration_3"

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        seen, kept = set(), []

        def run(x: torch.Tensor) -> torch.Tensor:
            seen.add(tuple(p._version for p in model.parameters()))
            for layer in model:
                x = self.first(x, layer)
            if len(seen) >= 3:
                kept.append(x.detach().clone())
            return x

        run.kept = kept
        return run


def _dp_recompiling_after_first_call(model: torch.nn.Module, spec: CaseSpec, recompiled):
    """A hand-written data-parallel wrapper (grad_divisor 1; each trainable gradient summed over the ranks from a
    post-accumulate hook at every call) whose layers run as eager's on its first call and, from its second on (its
    'recompiled' path), each through `recompiled(x, layer)`."""
    import torch.distributed as dist

    from te_verify.distributed.types import Wrapped, grad_of, param_slots, param_tensors, units_of, value_of

    slots, layers, calls = param_slots(model), units_of(model, spec), [0]
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda q: dist.all_reduce(q.grad))

    def forward(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == 1:
            return model(x)
        for layer in model:
            x = recompiled(x, layer)
        return x

    return Wrapped(forward, layers, lambda: param_tensors(slots, grad_of), lambda: param_tensors(slots, value_of),
                   lambda: [0] * len(layers), 1.0)


def dp_losing_frozen_after_first_call(model, spec):
    """Planted: from its second call on, every frozen layer whose input needs a gradient saves its input and computes
    its weight gradient, then drops it (LosesFrozenAfterStep's recompiled path)."""
    return _dp_recompiling_after_first_call(model, spec, LosesFrozenAfterStep.recompiled)


def dp_recompiling_correctly_after_first_call(model, spec):
    """The clean twin: from its second call on, split-K GEMMs (RecompilesCorrectly's path), the same FLOPs and saves."""
    return _dp_recompiling_after_first_call(model, spec, RecompilesCorrectly.recompiled)
