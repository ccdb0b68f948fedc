"""The backend protocol: a system under test, in the manner of thunder's TestExecutor."""
from __future__ import annotations

from typing import Callable, Protocol

import torch

from te_verify.spec import CaseSpec


class Backend(Protocol):
    """`name` identifies it in ids and reports; `available()` says whether it can run here and why not;
    `prepare(model, spec)` returns the callable that runs the model's forward.

    Contract: the callable computes with the very Parameter objects of `model`, so gradients land on
    `model.named_parameters()`. `prepare` is called once per case; every backward pass and probe of
    that case reuses the callable it returns.
    """

    name: str

    def available(self) -> tuple[bool, str]: ...

    def prepare(self, model: torch.nn.Module, spec: CaseSpec) -> Callable[[torch.Tensor], torch.Tensor]: ...
