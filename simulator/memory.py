"""Device memory of one simulated core: a caching HBM allocator like PyTorch's CUDA one.

The allocator itself is C++ (accounting.h, built by simulator/native.py), so that the C++
door accounts a warm eager call's output without a Python call; this module gives it its
Python name, its typing and its out-of-memory error. Its figures are accounting.h's:
512-byte blocks, a small pool of 2 MiB segments for requests up to 1 MiB, 20 MiB segments
for requests below 10 MiB, larger ones rounded up to 2 MiB.
"""

from __future__ import annotations

from typing import Protocol

from trnsim.simulator import native

ALIGNMENT = 512  # every block is a multiple of this many bytes (accounting.h: kAlignment)


class OutOfMemoryError(MemoryError):
    """Recoverable: free tensors (or call empty_cache) and retry, or use smaller batches."""

    def __init__(
        self, requested: int, allocated: int, reserved: int, capacity: int, limit: int | None = None
    ) -> None:
        self.requested = requested
        self.allocated = allocated
        self.reserved = reserved
        self.capacity = capacity
        allowed = (
            f"; {format_bytes(limit)} allowed by set_per_process_memory_fraction"
            if limit is not None and limit < capacity
            else ""
        )
        super().__init__(
            f"simulated HBM out of memory: tried to allocate {format_bytes(requested)}; "
            f"{format_bytes(allocated)} allocated by tensors, {format_bytes(reserved)} reserved by the "
            f"allocator, capacity {format_bytes(capacity)}{allowed} ({requested} / {allocated} / "
            f"{reserved} / {capacity} bytes). Free tensors you no longer need, call "
            f"empty_cache(), or reduce the batch size."
        )


def format_bytes(n: int) -> str:
    """n bytes in GiB, MiB or KiB (two decimals), or B."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


class Block(Protocol):
    """A piece of a segment, as the allocator hands it out (a C++ object): its address
    (offset), size (rounded), the bytes asked for, whether it is still allocated, and the
    address of the segment it is in."""

    @property
    def offset(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def requested(self) -> int: ...
    @property
    def allocated(self) -> bool: ...
    @property
    def segment_offset(self) -> int: ...


class Allocator(Protocol):
    """Caching allocator over one core's HBM: best-fit from cached blocks, split and
    coalesce. Like PyTorch's CUDA allocator, freed blocks stay reserved for reuse; a request
    that cannot be met releases fully free cached segments and retries before it fails
    (OutOfMemoryError). A freed block is parked by its size, for the next request of that
    size; any other request first returns parked blocks to the pools, where they coalesce."""

    capacity: int
    limit: int  # reserved bytes may not pass it (set_per_process_memory_fraction)

    def malloc(self, size: int) -> Block: ...
    def free(self, block: Block) -> None: ...  # (ValueError: a double free)
    # The same, for a block known by a handle (never reused: a stale one is refused), which
    # is all the runtime keeps of a tensor's block (client/core/device_memory.py).
    def take(self, size: int) -> int: ...
    def give(self, handle: int) -> None: ...  # (ValueError: a double free)
    def holds(self, handle: int) -> bool: ...  # (whether it is allocated)
    def requested(self, handle: int) -> int: ...  # (the bytes asked for)
    def empty_cache(self) -> None: ...
    def reset_peak_stats(self) -> None: ...
    def reset_accumulated_stats(self) -> None: ...
    @property
    def allocated_bytes(self) -> int: ...
    @property
    def reserved_bytes(self) -> int: ...
    @property
    def peak_allocated_bytes(self) -> int: ...
    def stats(self) -> dict[str, int]:
        """Counters plus fragmentation: cached bytes, and bytes cached in split segments."""
        ...

    def snapshot(self) -> list[dict[str, object]]:
        """Every segment with its blocks, in address order (torch.cuda.memory_snapshot's
        shape: address, total_size, segment_type, allocated_size, blocks with size, state)."""
        ...


def HbmAllocator(capacity: int) -> Allocator:
    """A caching allocator over `capacity` bytes of HBM (the C++ one, built on first use)."""
    allocator: Allocator = native.module().Allocator(capacity)
    return allocator
