"""What a linear site is (Site), and the linear-site weights of a built model (a Linear's, TE's Linear's, or a marked
matrix Parameter's), in module order: what the oracle's layer indices and the probes' layers mean."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from te_verify.models.marks import SITE_MARK
from te_verify.te import api as te_api


# TE's modules that are one linear site each (LayerNormLinear: a norm, then its linear).
TE_LINEARS = ("Linear", "LayerNormLinear")


@dataclass(frozen=True)
class Site:
    """One linear site: a layer, or one expert of a grouped layer."""

    # "2" for layer 2, "2.e1" for its expert 1 (the module names of the model's parameters); a model family's
    # qualified module name ("blocks.0.attn.q.lora_a").
    label: str
    # The stack's layer; a model family's position among its linear modules (the probes' layer index).
    layer: int
    # Rows it multiplies, and its weight's in/out features.
    rows: int
    fan_in: int
    fan_out: int
    # Trainable weight and bias, as in force during backward.
    weight_trainable: bool
    bias_trainable: bool
    # Does its input need a gradient (so its dgrad GEMM is required)?
    input_needs_grad: bool
    # The value it reads (a model family's fx node; "" for the stack): sites fed one value save it once.
    input_value: str = ""
    # Its input is the model input itself (never a new allocation when saved).
    input_is_model_input: bool = False

    def roles(self) -> set[str]:
        """Backward roles required per pass."""
        return {r for r, needed in (("dgrad", self.input_needs_grad), ("wgrad", self.weight_trainable),
                                    ("bgrad", self.bias_trainable)) if needed}

    def gemm_flops(self) -> int:
        return 2 * self.rows * self.fan_in * self.fan_out


def is_linear(module: torch.nn.Module) -> bool:
    """torch.nn.Linear, TE's Linear or LayerNormLinear (a module with a 2-D weight named like TE's), or the Linear of the --te-impl
    serving the TE lane (te_api.is_api_linear: a pure-PyTorch build's)."""
    return isinstance(module, torch.nn.Linear) or type(module).__module__.startswith("transformer_engine") and \
        type(module).__name__ in TE_LINEARS or te_api.is_api_linear(module)


class SiteWeight(NamedTuple):
    """One linear site's weight: its label, the tensor, and its (out, in) shape as the model was built (a Linear's
    features: a sharded wrapper may leave the Parameter holding a flat shard)."""

    label: str
    weight: torch.Tensor
    shape: tuple[int, int]


def linear_weights(model: torch.nn.Module) -> list[SiteWeight]:
    """Every linear site's weight in module order, the probes' layer order: each Linear's (torch's or TE's), named by
    the module; each marked matrix Parameter, named by the Parameter."""
    found = []
    for name, module in model.named_modules():
        if is_linear(module):
            found.append(SiteWeight(name, module.weight, (module.out_features, module.in_features)))
        found += [SiteWeight(f"{name}.{attr}" if name else attr, p, tuple(p.shape))
                  for attr, p in module.named_parameters(recurse=False) if attr in getattr(module, SITE_MARK, ())]
    return found


