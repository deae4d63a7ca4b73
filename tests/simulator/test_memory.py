"""The HBM caching allocator: accounting, reuse, fragmentation, OOM."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trnsim.simulator.config import TRN1, TRN2, MiB
from trnsim.simulator.memory import ALIGNMENT, HbmAllocator, OutOfMemoryError


def test_small_allocations_share_a_segment_and_are_reused():
    a = HbmAllocator(64 * MiB)
    x = a.malloc(1000)
    y = a.malloc(1000)
    assert x.segment_offset == y.segment_offset and x.offset != y.offset
    assert a.allocated_bytes == 2 * 1024
    assert a.reserved_bytes == 2 * MiB
    a.free(x)
    z = a.malloc(900)
    assert z.offset == x.offset, "a freed block is reused before new memory is reserved"
    assert a.stats()["num_segment_allocs"] == 1


def test_free_coalesces_neighbours():
    a = HbmAllocator(64 * MiB)
    blocks = [a.malloc(4096) for _ in range(4)]
    for b in blocks:
        a.free(b)
    assert a.stats()["cached_bytes"] == 2 * MiB, "the four blocks merged back into one"
    big = a.malloc(MiB)
    assert big.offset == blocks[0].offset
    assert a.stats()["segments"] == 1


def test_peak_and_reset():
    a = HbmAllocator(256 * MiB)
    x = a.malloc(30 * MiB)
    a.free(x)
    assert a.allocated_bytes == 0 and a.peak_allocated_bytes == 30 * MiB
    a.reset_peak_stats()
    assert a.peak_allocated_bytes == 0
    assert a.reserved_bytes == 30 * MiB, "freed memory stays reserved (cached)"
    a.empty_cache()
    assert a.reserved_bytes == 0


def test_out_of_memory_names_the_sizes():
    a = HbmAllocator(64 * MiB)
    keep = a.malloc(40 * MiB)
    with pytest.raises(OutOfMemoryError) as e:
        a.malloc(30 * MiB)
    err = e.value
    assert (err.requested, err.allocated, err.capacity) == (30 * MiB, 40 * MiB, 64 * MiB)
    assert "30.00 MiB" in str(err) and "64.00 MiB" in str(err) and "batch" in str(err)
    assert a.stats()["num_ooms"] == 1
    a.free(keep)
    a.malloc(30 * MiB)  # succeeds once memory is free


def test_oom_releases_cached_segments_before_failing():
    a = HbmAllocator(64 * MiB)
    x = a.malloc(40 * MiB)
    a.free(x)  # 40 MiB stays cached in a segment that does not fit the next request's size
    a.malloc(50 * MiB)
    assert a.stats()["num_cache_flushes"] == 1
    assert a.stats()["num_ooms"] == 0


def test_fragmentation_is_reported():
    a = HbmAllocator(64 * MiB)
    blocks = [a.malloc(100_000) for _ in range(10)]
    for b in blocks[::2]:
        a.free(b)
    stats = a.stats()
    assert stats["inactive_split_bytes"] >= 5 * 100_000
    assert stats["cached_bytes"] >= stats["inactive_split_bytes"]


def test_double_free_is_an_error():
    a = HbmAllocator(64 * MiB)
    x = a.malloc(10)
    a.free(x)
    with pytest.raises(ValueError, match="double free"):
        a.free(x)


def test_target_capacities():
    assert HbmAllocator(TRN1.hbm_bytes).capacity == 16 * 1024 * MiB
    assert HbmAllocator(TRN2.hbm_bytes).capacity == 12 * 1024 * MiB


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(1, 24 * MiB), st.integers(0, 1000)),
        min_size=1,
        max_size=60,
    )
)
def test_live_blocks_never_overlap_and_accounting_holds(ops):
    capacity = 128 * MiB
    a = HbmAllocator(capacity)
    live = []
    for is_alloc, size, pick in ops:
        if is_alloc or not live:
            try:
                live.append(a.malloc(size))
            except OutOfMemoryError as e:
                assert e.requested == size
        else:
            a.free(live.pop(pick % len(live)))
        spans = sorted((b.offset, b.offset + b.size) for b in live)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, "two live blocks overlap"
        assert all(b.offset % ALIGNMENT == 0 and b.offset + b.size <= capacity for b in live)
        assert a.allocated_bytes == sum(b.size for b in live)
        assert a.allocated_bytes <= a.reserved_bytes <= capacity


def test_a_block_known_by_its_handle_is_freed_once():
    """take/give, what the runtime holds of a tensor's block: a handle is never handed out
    again, so a stale one is refused instead of freeing the block now at its address."""
    a = HbmAllocator(64 * MiB)
    first = a.take(1000)
    assert a.holds(first) and a.requested(first) == 1000
    a.give(first)
    second = a.take(1000)  # (the same address, parked and taken back)
    assert second != first and not a.holds(first) and a.holds(second)
    with pytest.raises(ValueError, match="double free"):
        a.give(first)
    assert a.allocated_bytes == 1024, "the stale handle freed nothing"
    with pytest.raises(ValueError, match="negative"):
        a.take(-1)
    with pytest.raises(OutOfMemoryError):
        a.take(65 * MiB)
    a.give(second)
    assert a.allocated_bytes == 0 and a.stats()["num_frees"] == 2


def test_a_request_larger_than_the_device_is_out_of_memory_whatever_its_size():
    a = HbmAllocator(64 * MiB)
    for size in (65 * MiB, 2**63 - MiB, 2**63 - 1):  # (the last two would overflow rounding)
        with pytest.raises(OutOfMemoryError) as e:
            a.malloc(size)
        assert e.value.requested == size
    assert a.stats()["num_ooms"] == 3 and a.reserved_bytes == 0
    a.malloc(MiB)  # (nothing was corrupted)
    assert a.stats()["segments"] == 1
