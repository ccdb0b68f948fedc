"""A worked example: your own training engine, certified by te_verify as a backend of its own.

An engine is a wrapper whose `Wrapped` carries a `TrainStep`: te_verify then runs the engine's optimizer step after
every iteration and judges the parameters it leaves (`params_after_steps`, against eager SGD's trajectory) and the
state it reports per rank (`engine_state`, against the room the trainable parameters need). `FlatAllReduceSGD` trains
over examples/user_wrapper.py's flat all-reduce: SGD with momentum over the parameters that train, stepped once the
gradients are averaged, its momentum reported as its state. It imports only te_verify.api.

    pytest cases/test_dist_ddp.py --tier pr --backend examples.user_engine:FlatAllReduceSGD
"""
from __future__ import annotations

import torch
from torch import nn

from examples.user_wrapper import FlatAllReduceDP
from te_verify.api import CaseSpec, StateBytes, TrainStep, Wrapped, sgd


class FlatAllReduceSGD(FlatAllReduceDP):
    """The declaration: FlatAllReduceDP's, under its own name, with a training step."""

    # Rows' backend name and the wrapper part of case ids.
    name = "flat_allreduce_sgd"
    # Linear stacks under DDP's patterns. Not dist_lora: te_verify holds an engine's parameters to eager SGD's at lr
    # 0.1 for every step, and with LoRA on all seven projections of a Llama block that trajectory itself overflows by
    # the third step (docs/api.md); the built-in engines run LoRA on q and v only.
    families = ("dist_ddp",)

    def wrap(self, model: nn.Module, spec: CaseSpec) -> Wrapped:
        wrapped = super().wrap(model, spec)
        optimizer: list[torch.optim.Optimizer] = []  # made at the first step: a case may unfreeze after wrapping

        def step() -> None:
            trainable = [p for p in model.parameters() if p.requires_grad]
            if not optimizer and trainable:  # the optimizer eager's trajectory uses, over what trains now
                optimizer.append(sgd(trainable))
            for opt in optimizer:
                opt.step()
                opt.zero_grad(set_to_none=True)

        def state() -> dict[str, StateBytes]:
            momentum = [t for opt in optimizer for s in opt.state.values() for t in s.values()
                        if isinstance(t, torch.Tensor)]
            return {"optimizer_state": StateBytes(sum(t.numel() * t.element_size() for t in momentum), sharded=False)}

        wrapped.train = TrainStep(step=step, state=state)
        return wrapped
