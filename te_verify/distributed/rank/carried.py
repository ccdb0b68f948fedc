"""What a collective's buffer carries: which parameters' values or gradients, which model buffers. Runs in a rank.

Two ways, neither knowing the wrapper:
- Storage: a buffer on the bytes of a parameter (its values), of a parameter's `.grad`, or of a model buffer carries
  them (a wrapper all-reducing `p.grad`, broadcasting `p.data`, DDP broadcasting its module buffers). This names
  what content cannot: a parameter of one repeated value (LoRA B's zeros, a norm's ones).
- Content: a buffer holding a run of a tensor's values carries them (FSDP's flat all-gather shards, a bucket a
  wrapper filled by copying). The tensors' values are taken before wrapping (no step runs, so they do not change)
  and cast to the buffer's dtype, as a wrapper casting them would; a buffer is matched at every element offset, a
  window of consecutive elements (at least 64 bits, hashed to one int64) at a time. 64 bits of random parameter
  values never match by chance; windows of one repeated value (zeros, ones, sharding padding) name nothing and
  are left out.
A gradient is named by storage only: its values exist nowhere before the reduction. A reduction a wrapper fills
by copying gradients (DDP's buckets, FSDP's flat reduce-scatter input) is "gradients" without names; its bytes are
judged by checks.collectives.gradient_volume. Buffers of integer dtypes (FSDP2 packs mixed dtypes as bytes) are
matched by storage only.
Neither applies to a buffer whose layout the wrapper declares (Wrapped.buffer_layout): there the ranges the layout
names carry those parameters (their values, or their gradients in a grad buffer) and nothing else does, so memory an engine left uninitialised (a bucket's padding
holding an earlier case's copy of the same seeded weights) is never taken for this case's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

from te_verify.checks.collectives import Carried
from te_verify.distributed.types import Owned, Slot

HASH_MULTIPLIER = 0x9E3779B97F4A7C15 - (1 << 64)  # the 64-bit golden-ratio constant, as a signed int64
INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def window_of(element_size: int) -> int:
    """Elements per window: at least 64 bits and at least two elements (one element of fp64 may repeat)."""
    return max(2, 8 // element_size)


def window_keys(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(key of the window starting at every element offset, whether that window is one repeated value)."""
    width = window_of(flat.element_size())
    if flat.numel() < width:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.bool)
    bits = flat.contiguous().view(INT_OF_SIZE[flat.element_size()]).to(torch.int64).unfold(0, width, 1)
    keys = bits[:, 0].clone()
    for j in range(1, width):  # wraps around in int64: a hash, collisions as unlikely as chance matches
        keys = keys * HASH_MULTIPLIER + bits[:, j]
    return keys, (bits == bits[:, :1]).all(dim=1)


@dataclass
class _Index:
    """The sorted window keys of every tensor cast to one dtype, and which tensor(s) each belongs to."""

    keys: torch.Tensor
    owners: torch.Tensor  # index into groups, per key
    groups: list[tuple[str, ...]]


class ContentIndex:
    """Window keys of named tensors (parameters "P", buffers "buffer:B"), built per buffer dtype on first use."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = {name: t.detach().reshape(-1).cpu() for name, t in tensors.items() if t.is_floating_point()}
        self._by_dtype: dict[torch.dtype, _Index] = {}

    def _index(self, dtype: torch.dtype) -> _Index:
        if dtype not in self._by_dtype:
            names = list(self.tensors)
            keys, owners = [], []
            for k, name in enumerate(names):
                key, constant = window_keys(self.tensors[name].to(dtype))
                keys.append(key[~constant])
                owners.append(torch.full((int((~constant).sum()),), k, dtype=torch.int64))
            self._by_dtype[dtype] = _grouped(torch.cat(keys) if keys else torch.empty(0, dtype=torch.int64),
                                             torch.cat(owners) if owners else torch.empty(0, dtype=torch.int64), names)
        return self._by_dtype[dtype]

    def match(self, buffer: torch.Tensor) -> dict[str, int]:
        """Elements of `buffer` that are a run of each tensor's values, by name."""
        flat = buffer.detach().reshape(-1).cpu()
        if not flat.is_floating_point() or flat.numel() == 0:
            return {}
        index = self._index(flat.dtype)
        keys, constant = window_keys(flat)
        if not len(index.keys) or not len(keys):
            return {}
        at = torch.searchsorted(index.keys, keys).clamp(max=len(index.keys) - 1)
        hit = (index.keys[at] == keys) & ~constant
        offsets, owners = hit.nonzero().squeeze(1), index.owners[at[hit]]
        found: dict[str, int] = {}
        for owner in owners.unique().tolist():
            covered = torch.zeros(flat.numel(), dtype=torch.bool)
            starts = offsets[owners == owner]
            for j in range(window_of(flat.element_size())):
                covered[starts + j] = True
            for name in index.groups[owner]:
                found[name] = found.get(name, 0) + int(covered.sum())
        return found


def _grouped(keys: torch.Tensor, owners: torch.Tensor, names: list[str]) -> _Index:
    """Sorted unique keys; a key two tensors share (tied weights, equal buffers) belongs to both."""
    pairs = torch.unique(torch.stack([keys, owners]), dim=1)
    unique, inverse = torch.unique(pairs[0], return_inverse=True)
    members: dict[int, list[str]] = {}
    for slot, owner in zip(inverse.tolist(), pairs[1].tolist()):
        members.setdefault(slot, []).append(names[owner])
    groups = sorted({tuple(m) for m in members.values()})
    group_id = {g: k for k, g in enumerate(groups)}
    return _Index(unique, torch.tensor([group_id[tuple(members[s])] for s in range(len(unique))], dtype=torch.int64),
                  groups)


def byte_range(t: torch.Tensor) -> tuple[int, int] | None:
    """[start, end) of the bytes a tensor spans (a DTensor: its local shard); None without storage."""
    t = getattr(t, "_local_tensor", t)
    try:
        start = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
    except RuntimeError:
        return None
    return (start, start + t.numel() * t.element_size()) if t.numel() else None


class Attribution:
    """Names what a collective's tensors carry: the wrapper's declared layout where it has one for the tensor;
    otherwise storage first (what the wrapper holds now), then content."""

    def __init__(self, index: ContentIndex, holders: Callable[[], Iterable[tuple[str, str, torch.Tensor | None]]],
                 layout: Callable[[torch.Tensor], list[Owned] | None] | None = None):
        # holders() yields (name, what, tensor) for every tensor a buffer may share storage with, read at call
        # time: the wrapper's current parameters ("values"), their .grad ("grad"), the model's buffers ("values").
        self.index = index
        self.holders = holders
        # Wrapped.buffer_layout: which parameter owns which range of a tensor on the wrapper's buffers.
        self.layout = layout

    def __call__(self, tensors: list[torch.Tensor]) -> tuple[Carried, ...]:
        total: dict[tuple[str, str], int] = {}
        ranges = [(name, what, r) for name, what, t in self.holders() if t is not None and (r := byte_range(t))]
        for buffer in tensors:
            owned = self.layout(buffer) if self.layout is not None else None
            if owned is not None:
                for name, what, start, end in owned:
                    total[(name, what)] = total.get((name, what), 0) + (end - start) * buffer.element_size()
                continue
            found: dict[tuple[str, str], int] = {}  # one buffer: storage and content may both name a tensor
            span = byte_range(buffer)
            for name, what, (lo, hi) in ranges if span else ():
                overlap = min(hi, span[1]) - max(lo, span[0])
                if overlap > 0:
                    found[(name, what)] = found.get((name, what), 0) + overlap
            for name, elements in self.index.match(buffer).items():
                found[(name, "values")] = max(found.get((name, "values"), 0), elements * buffer.element_size())
            for key, nbytes in found.items():
                total[key] = total.get(key, 0) + nbytes
        return tuple(Carried(name, what, nbytes) for (name, what), nbytes in sorted(total.items()))


def collective_tensors(obj) -> list[torch.Tensor]:
    """The tensors in a collective's argument (a tensor or a list of them)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in collective_tensors(item)]
    return []


def held_tensors(slots: list[Slot], model: nn.Module):
    """(name, what, tensor) for what the wrapper holds now: each parameter by its pre-wrap name (a sharded
    wrapper's shard or gathered copy), its .grad, and the model's buffers."""
    for name, module, attr in slots:
        param = registered(module, attr)
        yield name, "values", param
        yield name, "grad", param.grad
    for name, b in model.named_buffers():
        yield f"buffer:{name}", "values", b


def registered(module: nn.Module, attr: str):
    """`getattr(module, attr)` without calling the parameter dict's __getitem__ where the parameter is registered
    there: ZeRO-3's ZeROOrderedDict gathers a partitioned parameter read during the engine's forward and registers it
    as an external parameter of the running module, kept gathered until that module's backward ends -- the observer
    would change what it observes. An attribute of the instance (FSDP1's use_orig_params views) is read as getattr
    reads it."""
    params = vars(module).get("_parameters")
    if attr in vars(module) or params is None or attr not in params:
        return getattr(module, attr)
    return dict.get(params, attr)
