"""Communication of a distributed step, from every collective a rank made, by phase and by what it carried.

- gradient_volume: the reduce-scatter / all-reduce volume after forward (backward and step), less what carried
  parameter values, equals the trainable bytes. Frozen parameters must not be reduced (volume above the trainable
  size plus sharding padding) and every trainable parameter must be (volume below the trainable size means a
  gradient skipped its reduction).
- frozen_collectives: nothing about a frozen parameter is communicated beyond what the wrapper's sharding needs.
  A sharding wrapper all-gathers a frozen parameter's unit once in forward, and once more in backward only where
  it reshards after forward and the unit takes part in backward (dgrad flows through it, or it trains: a unit is
  gathered whole); anything else carrying a frozen parameter (a broadcast or all-reduce of its values, a gradient
  reduction, a gather after backward, any collective of a wrapper that does not shard) is waste.
Phases: "forward"; "backward" while autograd runs the graph's nodes (their hooks included); "backward_end" for
end-of-backward callbacks (a wrapper's finalize, FSDP2's last reduce-scatter), run by autograd after the last node;
"step" for anything after backward returns.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from te_verify.checks.reshard import LayerInfo
from te_verify.checks.verdict import Verdict, waste_ratio

GRAD_REDUCTIONS = ("all_reduce", "reduce_scatter")
AFTER_FORWARD = ("backward", "backward_end", "step")
ALIGN_BYTES = 16  # FSDP1 with use_orig_params aligns every parameter in its flat buffer


@dataclass(frozen=True)
class Carried:
    """What part of a collective's buffer holds (distributed.carried names it)."""

    # A parameter's qualified name ("<layer>.<weight|bias>" for a stack), or "buffer:<name>" for a model buffer.
    name: str
    # "values" (the tensor's values or a shard of them) or "grad" (the parameter's .grad storage).
    what: str
    # Bytes of the buffer holding it.
    nbytes: int


@dataclass(frozen=True)
class Collective:
    """One outermost collective call in a rank."""

    # "all_reduce", "reduce_scatter", "all_gather" or "broadcast".
    kind: str
    # Bytes of its full-volume tensor(s) (the gathered output, the unreduced input).
    nbytes: int
    # "forward", "backward" or "step" (module docstring).
    phase: str
    # What its payload (the rank's contribution) carries, as far as storage and content tell.
    carries: tuple[Carried, ...] = ()
    # The training iteration it belongs to (a training engine's case runs several; a wrapper's case one: 0).
    iteration: int = 0
    # The microbatch of that iteration running when it was called (an engine accumulating gradients runs several).
    microbatch: int = 0
    # The dtype of the tensor(s) this rank contributed, as called ("float32", "bfloat16"; "" where not recorded).
    dtype: str = ""

    @property
    def value_bytes(self) -> int:
        return sum(c.nbytes for c in self.carries if c.what == "values")


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
    # The unit the wrapper wraps it in (an index into the LayerInfo list); None for the root's own parameters.
    unit: int | None = None

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


# Bytes per element of the floating dtypes a collective may run in (Collective.dtype).
ELEMENT_SIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


def reduction_bytes(calls: list[Collective], element_size: int | None = None) -> int:
    """Bytes reduced after forward, less what carried parameter values (frozen_collectives judges those); counted at
    `element_size` bytes per element where given: a mixed-precision policy reduces fp32 parameters' gradients in
    another dtype, and which dtype is collective_dtypes' to judge, not the volume's."""
    def grad_bytes(c: Collective) -> int:
        nbytes = max(c.nbytes - c.value_bytes, 0)
        own = ELEMENT_SIZE.get(c.dtype)
        return nbytes if element_size is None or own is None else nbytes * element_size // own

    return sum(grad_bytes(c) for c in calls if c.kind in GRAD_REDUCTIONS and c.phase in AFTER_FORWARD)


def summarize(calls: list[Collective]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in calls:
        out[f"{c.kind}_{c.phase}_calls"] = out.get(f"{c.kind}_{c.phase}_calls", 0) + 1
        out[f"{c.kind}_{c.phase}_bytes"] = out.get(f"{c.kind}_{c.phase}_bytes", 0) + c.nbytes
    return out


def gradient_volume(case_id: str, backend: str, calls: list[Collective], params: list[ParamInfo],
                    world_size: int, layout_slack: int = 0, reductions: int = 1) -> Verdict:
    """Reduction bytes after forward within [trainable bytes, trainable bytes + padding bound], `reductions` times
    (an engine that keeps only its gradient partition reduces every microbatch); `layout_slack`: the padding an
    engine's flat buffer adds (its bucket and parameter alignment, distributed.engines)."""
    sizes = {p.element_size for p in params}
    actual = reduction_bytes(calls, sizes.pop() if len(sizes) == 1 else None)
    trainable = [p for p in params if p.trainable]
    required = sum(p.nbytes for p in trainable) * reductions
    slack = (sum(p.padding_bound(world_size) for p in trainable) + layout_slack) * reductions
    figures = {"collectives_compared": len(calls), "collective_bytes_actual": actual, "collective_bytes_required": required,
               "collective_bytes_ratio": waste_ratio(actual, required),
               **summarize(calls)}
    head = f"[{case_id}] backend {backend}"
    if actual < required:
        return Verdict("gradient_volume", False, f"{head}: backward and step reduced {actual} B of gradients, the "
                       f"trainable parameters ({', '.join(p.name for p in trainable)}) need {required} B: some were "
                       "not reduced",
                       figures)
    if actual > required + slack:
        frozen = [p for p in params if not p.trainable]
        return Verdict("gradient_volume", False, f"{head}: backward and step reduced {actual} B of gradients, the "
                       f"trainable parameters need {required} B (+{slack} B padding at most): frozen parameters "
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


def frozen_collectives(case_id: str, backend: str, ranks: dict[int, list[Collective]], params: list[ParamInfo],
                       units: list[LayerInfo], shards: bool, regathers: bool, world_size: int = 2) -> Verdict:
    """Every collective carrying a frozen parameter, on every rank, against what the wrapper's sharding needs:
    `shards` (it all-gathers parameters for forward) and `regathers` (it reshards after forward, so it gathers again
    for backward the units that take part in it). A gather again in the same phase of one microbatch is waste; a
    payload holding less than half a rank's share of the parameter is not counted as a gather of it (a flat buffer's
    uninitialised padding may hold a stale row of it: Megatron-FSDP's buckets, 128 B of a 4 KiB weight)."""
    frozen, names = {p.name: p for p in params if not p.trainable}, {p.name for p in params}
    needed_back = any(u.needed_in_backward for u in units)  # the root unit's (embedding, head) take part if any does
    waste: dict[str, list[tuple[int, int, int]]] = {}  # message -> (rank, iteration, microbatch) of each
    figures = {"frozen_collectives_compared": sum(len(calls) for calls in ranks.values()),
               "frozen_comm_bytes_needed": 0, "frozen_comm_bytes_waste": 0, "value_comm_bytes": 0,
               "buffer_comm_bytes": 0}
    for rank, calls in sorted(ranks.items()):
        gathered: Counter = Counter()
        for c in calls:
            figures["value_comm_bytes"] += sum(x.nbytes for x in c.carries if x.what == "values" and x.name in names)
            figures["buffer_comm_bytes"] += sum(x.nbytes for x in c.carries if x.name.startswith("buffer:"))
            for x in c.carries:
                if x.name not in frozen:
                    continue
                p, why = frozen[x.name], None
                if not shards:
                    why = "a wrapper that does not shard needs no collective for a frozen parameter"
                elif x.what == "grad" or c.kind != "all_gather":
                    why = f"a sharding wrapper needs only all-gathers of a frozen parameter's values"
                elif c.phase in ("backward_end", "step"):
                    why = "nothing needs it gathered once backward's nodes have run"
                elif c.phase == "backward" and not regathers:
                    why = "the wrapper keeps it gathered from forward to backward"
                elif c.phase == "backward" and not (needed_back if p.unit is None else units[p.unit].needed_in_backward):
                    why = f"nothing flows back through {_unit_name(p)} (frozen, its input needs no gradient)"
                elif 2 * x.nbytes >= -(-p.nbytes // world_size):  # a gather of it: at least half a rank's share
                    key = (c.iteration, c.microbatch, c.phase, x.name)  # an engine runs several of each
                    gathered[key] += 1
                    if gathered[key] > 1:
                        why = f"gathered {gathered[key]} times in {c.phase}, once needed"
                if why is None:
                    figures["frozen_comm_bytes_needed"] += x.nbytes
                    continue
                figures["frozen_comm_bytes_waste"] += x.nbytes
                what = "the gradient" if x.what == "grad" else "the values"
                waste.setdefault(f"{c.kind} in {c.phase} carried {what} of frozen {x.name} ({x.nbytes:,} B): {why}",
                                 []).append((rank, c.iteration, c.microbatch))
    if not waste:
        return Verdict("frozen_collectives", True, figures=figures)
    return Verdict("frozen_collectives", False, f"[{case_id}] backend {backend}: "
                   + "; ".join(_wasted_at(m, where) for m, where in waste.items()), figures)


def _wasted_at(message: str, where: list[tuple[int, int, int]]) -> str:
    """`message` with the ranks that sent it and the iterations/microbatches (1-based) where it happened."""
    ranks = sorted({r for r, _, _ in where})
    steps = ", ".join(f"{i + 1}/{m + 1}" for i, m in sorted({(i, m) for _, i, m in where}))
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {message} (iteration/microbatch {steps})"


def _unit_name(p: ParamInfo) -> str:
    return "the root unit" if p.unit is None else f"unit {p.unit}"
