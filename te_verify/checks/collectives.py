"""Gradient communication: the reduce-scatter / all-reduce volume in backward equals the trainable bytes.

Frozen parameters must not be reduced (volume above the trainable size plus sharding padding) and every
trainable parameter must be (volume below the trainable size means a gradient skipped its reduction).
"""
from __future__ import annotations

from dataclasses import dataclass

from te_verify.checks.verdict import Verdict, waste_ratio

GRAD_REDUCTIONS = ("all_reduce", "reduce_scatter")
ALIGN_BYTES = 16  # FSDP1 with use_orig_params aligns every parameter in its flat buffer


@dataclass(frozen=True)
class ParamInfo:
    """One parameter as the communication check sees it."""

    # "<layer>.<weight|bias>".
    name: str
    # Shape of the full parameter.
    shape: tuple[int, ...]
    # Bytes per element.
    element_size: int
    # Does it require grad when backward runs?
    trainable: bool

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.element_size

    def padding_bound(self, world_size: int) -> int:
        """Most bytes sharding may add: dim 0 padded to a multiple of the world size, plus alignment."""
        row = self.nbytes // self.shape[0] if self.shape and self.shape[0] else self.element_size
        return (world_size - 1) * row + ALIGN_BYTES


def reduction_bytes(calls: list[tuple[str, int, str]]) -> int:
    return sum(nbytes for kind, nbytes, phase in calls if kind in GRAD_REDUCTIONS and phase == "backward")


def summarize(calls: list[tuple[str, int, str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for kind, nbytes, phase in calls:
        out[f"{kind}_{phase}_calls"] = out.get(f"{kind}_{phase}_calls", 0) + 1
        out[f"{kind}_{phase}_bytes"] = out.get(f"{kind}_{phase}_bytes", 0) + nbytes
    return out


def gradient_volume(case_id: str, backend: str, calls: list[tuple[str, int, str]], params: list[ParamInfo],
                    world_size: int) -> Verdict:
    """Backward reduction bytes within [trainable bytes, trainable bytes + padding bound]."""
    actual = reduction_bytes(calls)
    trainable = [p for p in params if p.trainable]
    required = sum(p.nbytes for p in trainable)
    slack = sum(p.padding_bound(world_size) for p in trainable)
    figures = {"collective_bytes_actual": actual, "collective_bytes_required": required,
               "collective_bytes_ratio": waste_ratio(actual, required),
               **summarize(calls)}
    head = f"[{case_id}] backend {backend}"
    if actual < required:
        return Verdict("gradient_volume", False, f"{head}: backward reduced {actual} B of gradients, the trainable "
                       f"parameters ({', '.join(p.name for p in trainable)}) need {required} B: some were not reduced",
                       figures)
    if actual > required + slack:
        frozen = [p for p in params if not p.trainable]
        return Verdict("gradient_volume", False, f"{head}: backward reduced {actual} B of gradients, the trainable "
                       f"parameters need {required} B (+{slack} B padding at most): frozen parameters "
                       f"({', '.join(p.name for p in frozen) or 'none'}) were communicated"
                       + explain_surplus(frozen, actual - required, slack), figures)
    return Verdict("gradient_volume", True, figures=figures)


def explain_surplus(frozen: list[ParamInfo], surplus: int, slack: int) -> str:
    """Which frozen parameters' bytes the surplus equals (within the padding bound), in module order: the first
    matching set, and the frozen parameters of the same sizes it cannot be told from (not tried past 24 of them:
    the search is over subsets)."""
    if len(frozen) > 24:
        return ""
    reach: dict[int, tuple[ParamInfo, ...]] = {0: ()}
    for p in frozen:
        for total, chosen in list(reach.items()):
            if total + p.nbytes <= surplus:
                reach.setdefault(total + p.nbytes, chosen + (p,))
    match = next((reach[t] for t in sorted(reach, reverse=True) if t and surplus - slack <= t), None)
    if match is None:
        return f"; the surplus of {surplus} B matches no set of frozen parameters"
    sizes = {p.nbytes for p in match}
    alike = [p.name for p in frozen if p.nbytes in sizes and p not in match]
    return (f"; the surplus of {surplus} B is the size of {', '.join(p.name for p in match)}"
            + (f" (or of same-sized {', '.join(alike)})" if alike else ""))
