"""Storage keys: how the dispatch watcher names the storage a tensor lives on (never two storages alike), the views
and copies it traces back, and what it reads off a tensor (real or traced, its Parameter, its address)."""
from __future__ import annotations

import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor

from te_verify.probes import extents, weight_axes
from te_verify.probes.layer_map import StorageKey


def _data_ptr(t: torch.Tensor) -> int | None:
    """The tensor's storage address; None for a wrapper subclass without storage of its own (a sharded DTensor
    parameter: its layer is then known by object and shape)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return None


def is_real(t: torch.Tensor) -> bool:
    """False for tensors a compiler traces with (FakeTensor, meta): their work is not the run's."""
    return not t.is_meta and not isinstance(t, FakeTensor)


def param_of(t: torch.Tensor) -> torch.nn.Parameter | None:
    if isinstance(t, torch.nn.Parameter):
        return t
    return t._base if isinstance(t._base, torch.nn.Parameter) else None


class StorageKeys:
    """The watcher's storage keys, copies and live storages (a base of probes.watcher.Watcher, whose __init__ makes
    the tables these read: _live, _seen, _derived, _extents, _axes, _weight_ptrs)."""

    def key(self, t: torch.Tensor) -> StorageKey:
        """The key of `t`'s storage, noting it first (`_see`), so no two storages ever keyed share one."""
        self._see(t)
        return self.key_of_storage(t.untyped_storage())

    def view_key(self, t: torch.Tensor) -> tuple:
        """A tensor as a view: (storage key, storage offset, numel); a transpose or reshape keeps it."""
        return (self.key(t), t.storage_offset(), t.numel())

    def root_view(self, t: torch.Tensor) -> tuple:
        """The view a tensor was copied from, through every copy followed (itself when none was). Keyed by the
        copy's storage, not its view: a slice or broadcast of a copy (split-K's halves, matmul's expand for bmm) is
        still a view of what it copies."""
        view = self.view_key(t)
        return self._derived.get(view[0], view)

    def _note_copy(self, out: torch.Tensor, args: tuple) -> None:
        tensors = [a for a in args if isinstance(a, torch.Tensor) and is_real(a)]
        sources = [a for a in tensors if a.numel() == out.numel()]
        if len(sources) == 1 and all(a.numel() <= 1 for a in tensors if a is not sources[0]):
            key, source_key = self.key(out), self.key(sources[0])
            self._derived[key] = self.root_view(sources[0])
            self._extents[key] = self._extents.get(source_key) or extents.extent_of(source_key, sources[0])
            source_axes = self._axes.get(self.key(sources[0]))
            axes = weight_axes.copy_axes(sources[0], source_axes, out) if source_axes else None
            if axes is not None:
                self._axes[key] = axes

    def axes_of(self, t: torch.Tensor) -> weight_axes.Axes | None:
        """Where a weight's axes lie in `t`'s storage (probes.weight_axes): a weight's or a followed copy's; row-major
        for a weight storage not bound (a wrapper's unsharded copy); None for a copy whose layout was lost."""
        key = self.key(t)
        axes = self._axes.get(key)
        return axes if axes is not None or key in self._derived else (1, 0)  # row-major: in-features at unit stride

    def key_of_storage(self, storage: torch.UntypedStorage) -> StorageKey:
        """The serial (an int) of a storage made during the run, else ("pre", data_ptr[, generation]): a storage
        not noted (`_see`) yet reads as its address's first, so keys go through `key`."""
        ptr = storage.data_ptr()
        entry = self._tracked(storage, ptr)
        if entry is not None:
            return entry[0]
        seen = self._seen.get(ptr)
        if seen is not None and seen[0] and seen[1]() is storage:
            return ("pre", ptr, seen[0])
        return ("pre", ptr)

    def _see(self, t: torch.Tensor) -> None:
        """Note a keyed storage that no dispatched op allocated. The first storage object seen at an address
        keeps the key ("pre", ptr); a later one there (a compiled kernel's buffer reusing a dead one's memory) gets
        ("pre", ptr, generation), so it is not taken for the earlier one. Not a new allocation for the byte
        figures: nothing dispatched made it."""
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        seen = self._seen.get(ptr)
        if (ptr == 0 or self._tracked(storage, ptr) is not None or (seen is not None and seen[1]() is storage)
                or ptr in self._weight_ptrs or param_of(t) is not None):
            return
        self._seen[ptr] = (0 if seen is None else seen[0] + 1, weakref.ref(storage))

    def _tracked(self, storage: torch.UntypedStorage, ptr: int) -> tuple | None:
        """The live entry of this storage object at `ptr`; None for another object there (one whose memory an
        older storage gave back with resize_(0), as FSDP frees gathered parameters, is a new allocation)."""
        entry = self._live.get(ptr)
        return entry if entry is not None and entry[2]() is storage else None

    @property
    def storages_made(self) -> int:
        """How many storages ops made since the watcher was pushed (the serial of the latest)."""
        return self._serial

    def live_storages(self, since: int = 0) -> list[tuple[int, int]]:
        """(data_ptr, nbytes) of the storages made after the `since`-th that are still alive."""
        return [(ptr, entry[1]) for ptr, entry in self._live.items() if entry[0] > since and entry[2]() is not None]

    def live_serials(self) -> set[int]:
        """Keys (serials) of the storages ops made that are still alive."""
        return {entry[0] for entry in self._live.values() if entry[2]() is not None}

    def is_new(self, t: torch.Tensor) -> bool:
        storage = t.untyped_storage()
        return self._tracked(storage, storage.data_ptr()) is not None
