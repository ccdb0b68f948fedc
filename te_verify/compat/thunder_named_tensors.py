"""thunder 0.2.6 on torch >= 2.13: stand-ins for the five removed named-tensor methods.

thunder's `default_torch_ops` references Tensor.align_as, align_to, has_names, refine_names and rename at
import time (lightning-thunder PR 2829 adds the guard upstream; not in a release). The stand-ins only let
the import succeed: calling any of them raises, so no run can silently depend on them.
"""
from __future__ import annotations

import torch

from te_verify.compat import record

REMOVED_IN_2_13 = ("align_as", "align_to", "has_names", "refine_names", "rename")
STEP = "thunder-named-tensor-stubs: torch>=2.13 removed Tensor.{align_as,align_to,has_names,refine_names,rename}; raising stand-ins installed so thunder 0.2.6 imports (upstream fix: lightning-thunder PR 2829)"


def _stand_in(name: str):
    def removed(*args, **kwargs):
        raise RuntimeError(f"torch.Tensor.{name} was removed in torch 2.13; te_verify installed this stand-in only so thunder imports")

    removed.__name__ = name  # thunder checks the registered function's name against the attribute
    removed.__qualname__ = f"Tensor.{name}"
    return removed


def apply() -> bool:
    """Install the stand-ins if this torch lacks the methods; return whether anything was installed."""
    missing = [n for n in REMOVED_IN_2_13 if not hasattr(torch.Tensor, n)]
    if not missing:
        return False
    for name in missing:
        setattr(torch.Tensor, name, _stand_in(name))
    record(STEP)
    return True
