"""Device memory of one simulated core: a caching HBM allocator like PyTorch's CUDA one."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from trnsim.simulator.config import MiB

ALIGNMENT = 512  # every block is a multiple of this many bytes
SMALL_REQUEST = 1 * MiB  # requests up to this size come from the small pool
SMALL_SEGMENT = 2 * MiB  # segment size of the small pool
MEDIUM_SEGMENT = 20 * MiB  # large requests below 10 MiB share 20 MiB segments
MEDIUM_REQUEST = 10 * MiB
LARGE_ROUNDING = 2 * MiB  # larger requests get a segment of their size rounded up to this


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


def round_size(size: int) -> int:
    return max(ALIGNMENT, -(-size // ALIGNMENT) * ALIGNMENT)


def segment_size(rounded: int) -> int:
    if rounded <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if rounded < MEDIUM_REQUEST:
        return MEDIUM_SEGMENT
    return -(-rounded // LARGE_ROUNDING) * LARGE_ROUNDING


@dataclass(eq=False, slots=True)
class Segment:
    offset: int
    size: int
    small: bool
    blocks_in_use: int = 0
    # The block at the segment's start: blocks merge into it, never it into another.
    head: Block | None = field(default=None, repr=False)


@dataclass(eq=False, slots=True)
class Block:
    """A piece of a segment: either handed out (allocated) or cached for reuse."""

    segment: Segment
    offset: int
    size: int
    requested: int = 0
    allocated: bool = False
    cached: bool = False  # in its pool (HbmAllocator._cache), for reuse
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)

    def sort_key(self) -> tuple[int, int]:
        return (self.size, self.offset)


def _has_free_neighbour(block: Block) -> bool:
    return (block.prev is not None and block.prev.cached) or (
        block.next is not None and block.next.cached
    )


class _AddressSpace:
    """First-fit ranges of the core's HBM address space, handed out as segments."""

    def __init__(self, capacity: int) -> None:
        self.free: list[tuple[int, int]] = [(0, capacity)]  # (offset, size), sorted by offset

    def take(self, size: int) -> int | None:
        for i, (offset, free_size) in enumerate(self.free):
            if free_size >= size:
                if free_size == size:
                    del self.free[i]
                else:
                    self.free[i] = (offset + size, free_size - size)
                return offset
        return None

    def give_back(self, offset: int, size: int) -> None:
        i = bisect.bisect(self.free, (offset, size))
        self.free.insert(i, (offset, size))
        # Coalesce with the neighbours on both sides.
        if i + 1 < len(self.free) and offset + size == self.free[i + 1][0]:
            size += self.free.pop(i + 1)[1]
            self.free[i] = (offset, size)
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == offset:
            prev_offset, prev_size = self.free.pop(i - 1)
            self.free[i - 1] = (prev_offset, prev_size + size)

    def largest_free(self) -> int:
        return max((size for _, size in self.free), default=0)


class HbmAllocator:
    """Caching allocator over one core's HBM: best-fit from cached blocks, split and coalesce.

    Like PyTorch's CUDA allocator, freed blocks stay reserved for reuse; a request that
    cannot be met releases fully free cached segments and retries before it fails.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.limit = capacity  # reserved bytes may not pass it (set_per_process_memory_fraction)
        self._space = _AddressSpace(capacity)
        self._pools: dict[bool, list[tuple[int, int, Block]]] = {True: [], False: []}
        self._segments: list[Segment] = []
        # Freed blocks parked by exact size: the next request of that size takes one back in
        # O(1) (the common case in a training loop). Any other request first returns them
        # to the pools, where they coalesce as usual.
        self._parked: dict[int, list[Block]] = {}
        self._counters = {
            "allocated_bytes": 0,
            "requested_bytes": 0,
            "reserved_bytes": 0,
            "peak_allocated_bytes": 0,
            "peak_reserved_bytes": 0,
            "num_allocs": 0,
            "num_frees": 0,
            "num_segment_allocs": 0,
            "num_segment_frees": 0,
            "num_ooms": 0,
            "num_cache_flushes": 0,
        }

    # -- public API ---------------------------------------------------------------------------
    def malloc(self, size: int) -> Block:
        if size < 0:
            raise ValueError(f"cannot allocate a negative size ({size} bytes)")
        rounded = max(ALIGNMENT, -(-size // ALIGNMENT) * ALIGNMENT)
        parked = self._parked.get(rounded)
        if parked:  # the common case, kept short: it runs for every op's output
            reused = parked.pop()
            reused.allocated = True
            reused.requested = size
            reused.segment.blocks_in_use += 1
            c = self._counters
            allocated = c["allocated_bytes"] + rounded
            c["allocated_bytes"] = allocated
            c["requested_bytes"] += size
            c["peak_allocated_bytes"] = max(c["peak_allocated_bytes"], allocated)
            c["num_allocs"] += 1
            return reused
        self._unpark()
        small = rounded <= SMALL_REQUEST
        block = self._take_cached(small, rounded)
        if block is None:
            block = self._new_segment(small, rounded)
        if block is None:
            self._counters["num_cache_flushes"] += 1
            self.empty_cache()
            block = self._new_segment(small, rounded)
        if block is None:
            self._counters["num_ooms"] += 1
            raise OutOfMemoryError(
                size, self.allocated_bytes, self.reserved_bytes, self.capacity, self.limit
            )
        self._split(block, rounded, small)
        block.allocated = True
        block.requested = size
        block.segment.blocks_in_use += 1
        self._count_alloc(block)
        return block

    def free(self, block: Block) -> None:
        if not block.allocated:
            raise ValueError(f"double free of the block at offset {block.offset}")
        block.allocated = False
        block.segment.blocks_in_use -= 1
        c = self._counters
        c["allocated_bytes"] -= block.size
        c["requested_bytes"] -= block.requested
        c["num_frees"] += 1
        block.requested = 0
        parked = self._parked.get(block.size)
        if parked is None:
            self._parked[block.size] = [block]
        else:
            parked.append(block)

    def _unpark(self) -> None:
        if not self._parked:
            return
        parked = [b for blocks in self._parked.values() for b in blocks]
        self._parked.clear()
        for block in parked:
            self._cache(block)
        for block in parked:
            if block.cached and _has_free_neighbour(block):  # (else it stays as it is)
                self._uncache(block)  # (an uncached one: an earlier one merged it)
                self._cache(self._coalesce(block))

    def empty_cache(self) -> None:
        """Releases every cached segment that holds no allocated block."""
        self._unpark()
        for segment in [s for s in self._segments if s.blocks_in_use == 0]:
            for pool in self._pools.values():
                for e in pool:
                    if e[2].segment is segment:
                        e[2].cached = False
                pool[:] = [e for e in pool if e[2].segment is not segment]
            self._segments.remove(segment)
            self._space.give_back(segment.offset, segment.size)
            self._counters["reserved_bytes"] -= segment.size
            self._counters["num_segment_frees"] += 1

    def reset_peak_stats(self) -> None:
        self._counters["peak_allocated_bytes"] = self._counters["allocated_bytes"]
        self._counters["peak_reserved_bytes"] = self._counters["reserved_bytes"]

    def reset_accumulated_stats(self) -> None:
        """The historical counts (allocations, frees, segments, OOMs, cache flushes) to 0."""
        for name in self._counters:
            if name.startswith("num_"):
                self._counters[name] = 0

    @property
    def allocated_bytes(self) -> int:
        return self._counters["allocated_bytes"]

    @property
    def reserved_bytes(self) -> int:
        return self._counters["reserved_bytes"]

    @property
    def peak_allocated_bytes(self) -> int:
        return self._counters["peak_allocated_bytes"]

    def stats(self) -> dict[str, int]:
        """Counters plus fragmentation: cached bytes, and bytes cached in split segments."""
        self._unpark()
        cached = sum(e[2].size for pool in self._pools.values() for e in pool)
        inactive_split = sum(
            e[2].size for pool in self._pools.values() for e in pool if e[2].segment.blocks_in_use
        )
        return {
            **self._counters,
            "cached_bytes": cached,
            "inactive_split_bytes": inactive_split,
            "segments": len(self._segments),
            "largest_free_range_bytes": self._space.largest_free(),
            "capacity_bytes": self.capacity,
        }

    def snapshot(self) -> list[dict[str, object]]:
        """Every segment with its blocks, in address order (torch.cuda.memory_snapshot's
        shape: address, total_size, segment_type, allocated_size, blocks with size, state)."""
        self._unpark()
        out: list[dict[str, object]] = []
        for seg in sorted(self._segments, key=lambda s: s.offset):
            chain = []
            b = seg.head
            while b is not None:
                chain.append(b)
                b = b.next
            out.append(
                {
                    "address": seg.offset,
                    "total_size": seg.size,
                    "stream": 0,
                    "segment_type": "small" if seg.small else "large",
                    "allocated_size": sum(b.size for b in chain if b.allocated),
                    "active_size": sum(b.size for b in chain if b.allocated),
                    "requested_size": sum(b.requested for b in chain if b.allocated),
                    "blocks": [
                        {
                            "address": b.offset,
                            "size": b.size,
                            "requested_size": b.requested,
                            "state": "active_allocated" if b.allocated else "inactive",
                        }
                        for b in chain
                    ],
                }
            )
        return out

    # -- internals ----------------------------------------------------------------------------
    def _take_cached(self, small: bool, rounded: int) -> Block | None:
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (rounded, -1))
        if i == len(pool):
            return None
        block = pool.pop(i)[2]
        block.cached = False
        # Like the CUDA allocator: do not carve small requests out of oversized large blocks.
        if not small and rounded < MEDIUM_REQUEST and block.size >= MEDIUM_REQUEST * 2:
            self._cache(block)
            return None
        return block

    def _new_segment(self, small: bool, rounded: int) -> Block | None:
        size = segment_size(rounded)
        if self._counters["reserved_bytes"] + size > self.limit:
            return None
        offset = self._space.take(size)
        if offset is None:
            return None
        segment = Segment(offset, size, small)
        self._segments.append(segment)
        c = self._counters
        c["reserved_bytes"] += size
        c["peak_reserved_bytes"] = max(c["peak_reserved_bytes"], c["reserved_bytes"])
        c["num_segment_allocs"] += 1
        segment.head = Block(segment, offset, size)
        return segment.head

    def _split(self, block: Block, rounded: int, small: bool) -> None:
        remaining = block.size - rounded
        min_split = ALIGNMENT if small else SMALL_REQUEST
        if remaining < min_split:
            return
        rest = Block(block.segment, block.offset + rounded, remaining, prev=block, next=block.next)
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = rounded
        self._cache(rest)

    def _coalesce(self, block: Block) -> Block:
        """Merges the block with every free cached neighbour on both sides."""
        while block.prev is not None and block.prev.cached:
            prev = block.prev
            self._uncache(prev)
            prev.size += block.size
            prev.next = block.next
            if block.next is not None:
                block.next.prev = prev
            block = prev
        while block.next is not None and block.next.cached:
            nxt = block.next
            self._uncache(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        return block

    def _cache(self, block: Block) -> None:
        bisect.insort(self._pools[block.segment.small], (block.size, block.offset, block))
        block.cached = True

    def _uncache(self, block: Block) -> None:
        pool = self._pools[block.segment.small]
        i = bisect.bisect_left(pool, (block.size, block.offset))
        assert pool[i][2] is block, "cached block index out of sync"
        del pool[i]
        block.cached = False

    def _count_alloc(self, block: Block) -> None:
        c = self._counters
        c["allocated_bytes"] += block.size
        c["requested_bytes"] += block.requested
        c["peak_allocated_bytes"] = max(c["peak_allocated_bytes"], c["allocated_bytes"])
        c["num_allocs"] += 1
