"""The device's memory as the runtime keeps it: each neuron storage's simulated HBM block,
freed when the storage dies, and the CPU tensor whose memory it is (a cheaper host alias than
DLPack). FSDP2's freed-but-kept storages are parked: their HBM goes back, their object stays.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from trnsim.client.core.errors import out_of_memory
from trnsim.client.core.memory import to_host_alias
from trnsim.simulator.memory import Allocator, OutOfMemoryError

Block = int  # an HBM block, by the allocator's handle (simulator/memory.py: Allocator.take)


class _Held(weakref.ref[torch.UntypedStorage]):
    """A device storage's weak reference, holding what its death gives back: its HBM block,
    its data_ptr (0: not keyed by its memory, see adopt_storage), the CPU tensor whose
    memory it is, and that tensor's (shape, stride, dtype, False) once a lookup needed it
    (the form of a tensor's part of an op signature, client/door/kernel.py)."""

    __slots__ = ("block", "host", "meta", "ptr")
    block: Block
    host: torch.Tensor
    meta: tuple[object, ...] | None
    ptr: int


class _Adopted:
    """_Held's record of a storage that gives its memory back itself: one the C++ door made
    (client/door/fast_door.cpp), whose death calls DeviceMemory._release with this record
    (no Python storage object, no weak reference: each costs a served op more than the
    rest of its accounting)."""

    __slots__ = ("block", "host", "meta", "ptr")
    block: Block
    host: torch.Tensor
    meta: tuple[object, ...] | None
    ptr: int


# The C++ door's adoption (client/door/fast.py installs it): for memory it made, the
# storage's death calls the release given with the record given; the memory's key, or -1
# for memory it did not make (then watched by a weak reference to its storage).
native_adopt: list[Callable[[torch.Tensor, Callable[[_Adopted], None], _Adopted], int]] = []


class DeviceMemory:
    """Allocation, adoption by a storage, park/unpark, host aliases. `flush` runs what is
    recorded before memory it may read is taken away; `counts` are the runtime's counters
    (client/core/metrics.py), where allocations are counted."""

    def __init__(
        self,
        allocator: Allocator,
        flush: Callable[[str], None],
        counts: dict[str, int],
    ) -> None:
        self.allocator = allocator
        self._flush = flush
        self._counts = counts
        self._take = allocator.take
        self._give = allocator.give
        # Every adopted storage alive has one _Held, here by its data_ptr (keyed: the host
        # alias is found by a tensor's data_ptr, park/unpark by the storage's) or, when its
        # memory cannot key it (no bytes, complex, a data_ptr already held), by id(ref).
        self.hosts: dict[int, _Held | _Adopted] = {}
        self._unkeyed: dict[int, _Held | _Adopted] = {}
        self._parked: dict[int, int] = {}  # data_ptr -> bytes, of storages park()ed

    def allocate(self, nbytes: int) -> Block:
        try:
            block = self._take(nbytes)
        except OutOfMemoryError as e:
            raise out_of_memory(e) from None
        self._counts["allocations"] += 1
        return block

    def allocate_each(self, sizes: list[int | None]) -> list[Block | None]:
        """A block for each size (None for None), in order; if one cannot be had, those
        taken already are given back before the error is raised."""
        blocks: list[Block | None] = []
        try:
            for nbytes in sizes:
                blocks.append(None if nbytes is None else self.allocate(nbytes))
        except BaseException:
            self.free_unadopted([b for b in blocks if b is not None])
            raise
        return blocks

    def adopt(self, tensor: torch.Tensor, block: Block, host: torch.Tensor) -> torch.Tensor:
        """Frees the block when the tensor's storage dies (views keep it alive); remembers
        the CPU tensor whose memory it is until then. Memory the C++ door made (memory.py:
        to_device) gives its block back itself; other memory is watched by a weak reference
        to its storage."""
        if native_adopt:
            record = _Adopted()
            key = native_adopt[0](tensor, self._release, record)
            if key >= 0:
                self._hold(record, key, block, host)
                return tensor
        self.adopt_storage(tensor.untyped_storage(), block, host)
        return tensor

    def adopt_storage(
        self, storage: torch.UntypedStorage, block: Block, host: torch.Tensor
    ) -> None:
        self._hold(
            _Held(storage, self._release),
            storage.data_ptr() if storage.nbytes() else 0,
            block,
            host,
        )

    def adopted(self, ptr: int, block: Block, host: torch.Tensor) -> _Adopted:
        """adopt() of a storage that frees its block itself, by calling _release with the
        record returned when it dies (the C++ door's: `ptr`, its memory's address, 0 when
        it has no bytes)."""
        record = _Adopted()
        self._hold(record, ptr, block, host)
        return record

    def _hold(self, ref: _Held | _Adopted, ptr: int, block: Block, host: torch.Tensor) -> None:
        ref.block, ref.host, ref.meta = block, host, None
        ptr = ref.ptr = ptr if not host.is_complex() else 0
        if not ptr or self.hosts.setdefault(ptr, ref) is not ref:
            ref.ptr = 0
            self._unkeyed[id(ref)] = ref

    def _release(self, ref: _Held | _Adopted) -> None:
        ptr = ref.ptr
        if ptr:
            if self.hosts.pop(ptr, None) is None:
                return
            if self._parked and self._parked.pop(ptr, None) is not None:
                return  # (a parked one's block is gone)
        elif self._unkeyed.pop(id(ref), None) is None:
            return
        self._give(ref.block)

    def park(self, storage: torch.UntypedStorage) -> None:
        """A storage its owner calls freed while keeping the object (FSDP2 resizes an
        unsharded parameter's storage to 0 bytes): its HBM goes back to the allocator. A
        neuron storage cannot change size (PyTorch gives Python backends no storage
        resize), so its host memory stays until unpark() or the storage dies."""
        ref = self.hosts.get(storage.data_ptr())
        if ref is not None and ref.ptr not in self._parked:
            self._flush("hazard")
            self._parked[ref.ptr] = self.allocator.requested(ref.block)
            self._give(ref.block)

    def unpark(self, storage: torch.UntypedStorage) -> None:
        """The storage is in use again: it takes HBM again (OutOfMemoryError if none)."""
        ref = self.hosts.get(storage.data_ptr())
        if ref is not None and ref.ptr in self._parked:
            ref.block = self.allocate(self._parked.pop(ref.ptr))

    def host_alias(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor over a neuron tensor's memory: the allocation's own CPU tensor when
        t is the whole allocation (parameters, op outputs), else a DLPack alias (views)."""
        return self.host_alias_as(t, (t.shape, t.stride(), t.dtype, False))

    def host_alias_as(self, t: torch.Tensor, meta: tuple[object, ...]) -> torch.Tensor:
        """host_alias(t), given t's (shape, stride, dtype, is_cpu): its part of the op's
        signature, which the door has read already."""
        ref = self.hosts.get(t.data_ptr())
        if ref is not None:
            known = ref.meta
            if known is None:
                h = ref.host
                known = ref.meta = (h.shape, h.stride(), h.dtype, False)
            # (complex allocations, which may be conj views, are not kept)
            if known == meta and not t.is_neg():
                return ref.host
        return self._alias(t)

    def _alias(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU view of t over its allocation's own CPU tensor, which keeps the memory alive
        by itself; else a DLPack alias. (A DLPack alias holds t's TensorImpl, not its storage:
        once `t.data = ...` gives t another storage, the memory it aliases may be freed while
        a recorded op still reads it.)"""
        if not (t.is_conj() or t.is_neg()):
            # (its storage's address, without a Python storage object: one would count as a
            # reference to the storage, and autograd would then add gradients out of place)
            ref = self.hosts.get(t.data_ptr() - int(t.storage_offset()) * t.element_size())
            if ref is not None and ref.host.dtype == t.dtype:
                host = ref.host
                return host.as_strided(
                    t.shape, t.stride(), host.storage_offset() + t.storage_offset()
                )
        return to_host_alias(t)

    def free_unadopted(self, blocks: list[Block]) -> None:
        for b in blocks:
            if self.allocator.holds(b):
                self._give(b)

    # -- what torch.neuron reads and sets (memory_allocated, memory_stats...) ------------------
    def allocated_bytes(self) -> int:
        return self.allocator.allocated_bytes

    def peak_allocated_bytes(self) -> int:
        return self.allocator.peak_allocated_bytes

    def reserved_bytes(self) -> int:
        return self.allocator.reserved_bytes

    def memory_capacity(self) -> int:
        """The core's HBM, bytes."""
        return self.allocator.capacity

    def memory_limit(self) -> int:
        """The bytes this process may reserve (set_memory_limit)."""
        return self.allocator.limit

    def set_memory_limit(self, nbytes: int) -> None:
        """Caps reserved memory: past it the allocator frees cached blocks and retries."""
        self.allocator.limit = nbytes

    def memory_stats(self) -> dict[str, int]:
        """The allocator's counters, cached and fragmented bytes, capacity (HbmAllocator.stats)."""
        return self.allocator.stats()

    def memory_snapshot(self) -> list[dict[str, object]]:
        """Every segment and its blocks, in address order (HbmAllocator.snapshot)."""
        return self.allocator.snapshot()

    def reset_peak_stats(self) -> None:
        self.allocator.reset_peak_stats()

    def reset_accumulated_stats(self) -> None:
        """The allocator's historical counts (allocations, frees, OOMs...) back to 0."""
        self.allocator.reset_accumulated_stats()

    def empty_cache(self) -> None:
        """Releases every cached segment that holds no allocated block."""
        self.allocator.empty_cache()
