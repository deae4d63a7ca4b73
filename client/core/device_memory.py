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
from trnsim.simulator.memory import Block, HbmAllocator, OutOfMemoryError


class DeviceMemory:
    """Allocation, adoption by a storage, park/unpark, host aliases. `flush` runs what is
    recorded before memory it may read is taken away; `count` counts allocations."""

    def __init__(
        self,
        allocator: HbmAllocator,
        flush: Callable[[str], None],
        count: Callable[[str], None],
    ) -> None:
        self.allocator = allocator
        self._flush = flush
        self._count = count
        self._blocks: dict[int, tuple[weakref.ref[torch.UntypedStorage], Block, int]] = {}
        self._block_keys: dict[int, int] = {}  # data_ptr -> its key in _blocks
        self._parked: dict[int, int] = {}  # data_ptr -> bytes, of storages park()ed
        # data_ptr of each live device storage -> the CPU tensor it was made from (same
        # memory, the allocation's sizes and strides): a cheaper host alias than DLPack.
        self.hosts: dict[int, torch.Tensor] = {}

    def allocate(self, nbytes: int) -> Block:
        try:
            block = self.allocator.malloc(nbytes)
        except OutOfMemoryError as e:
            raise out_of_memory(e) from None
        self._count("allocations")
        return block

    def adopt(self, tensor: torch.Tensor, block: Block, host: torch.Tensor) -> torch.Tensor:
        """Frees the block when the tensor's storage dies (views keep it alive); remembers
        the CPU tensor whose memory it is until then."""
        self.adopt_storage(tensor.untyped_storage(), block, host)
        return tensor

    def adopt_storage(
        self, storage: torch.UntypedStorage, block: Block, host: torch.Tensor
    ) -> None:
        ref = weakref.ref(storage, self._release)
        ptr = storage.data_ptr() if block.requested and not host.is_complex() else 0
        if ptr:
            self.hosts[ptr] = host
            self._block_keys[ptr] = id(ref)
        self._blocks[id(ref)] = (ref, block, ptr)

    def _release(self, ref: weakref.ref[torch.UntypedStorage]) -> None:
        entry = self._blocks.pop(id(ref), None)
        if entry is not None:
            if self._parked.pop(entry[2], None) is None:  # (a parked one's block is gone)
                self.allocator.free(entry[1])
            if entry[2]:
                self.hosts.pop(entry[2], None)
                self._block_keys.pop(entry[2], None)

    def park(self, storage: torch.UntypedStorage) -> None:
        """A storage its owner calls freed while keeping the object (FSDP2 resizes an
        unsharded parameter's storage to 0 bytes): its HBM goes back to the allocator. A
        neuron storage cannot change size (PyTorch gives Python backends no storage
        resize), so its host memory stays until unpark() or the storage dies."""
        key = self._block_keys.get(storage.data_ptr(), -1)
        entry = self._blocks.get(key)
        if entry is not None and entry[2] not in self._parked:
            self._flush("hazard")
            self._parked[entry[2]] = entry[1].requested
            self.allocator.free(entry[1])  # (the allocator may hand the Block out again)

    def unpark(self, storage: torch.UntypedStorage) -> None:
        """The storage is in use again: it takes HBM again (OutOfMemoryError if none)."""
        key = self._block_keys.get(storage.data_ptr(), -1)
        entry = self._blocks.get(key)
        if entry is not None and entry[2] in self._parked:
            block = self.allocate(self._parked.pop(entry[2]))
            self._blocks[key] = (entry[0], block, entry[2])

    def host_alias(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor over a neuron tensor's memory: the allocation's own CPU tensor when
        t is the whole allocation (parameters, op outputs), else a DLPack alias (views)."""
        h = self.hosts.get(t.data_ptr())
        if (
            h is not None
            and h.shape == t.shape
            and h.stride() == t.stride()
            and h.dtype == t.dtype
            and not t.is_neg()  # (complex allocations, which may be conj views, are not kept)
        ):
            return h
        return to_host_alias(t)

    def free_unadopted(self, blocks: list[Block]) -> None:
        for b in blocks:
            if b.allocated:
                self.allocator.free(b)

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
