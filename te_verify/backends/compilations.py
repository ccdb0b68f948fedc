"""How many times a prepared callable was compiled: thunder's cache misses, or dynamo's graphs for this case."""
from __future__ import annotations

import sys


def count_compilations(fn) -> int | None:
    """None for callables that are neither thunder-jitted nor torch.compile'd (nor wrap one in __wrapped__)."""
    fn = getattr(fn, "__wrapped__", fn)
    if "thunder" in sys.modules:
        thunder = sys.modules["thunder"]
        try:
            return int(thunder.cache_misses(fn))
        except Exception:  # not a thunder function: thunder raises on foreign callables
            pass
    if type(fn).__name__ == "OptimizedModule":
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])  # cleared before every case (isolation.fresh_case)
    return None
