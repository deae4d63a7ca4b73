"""Interval indexes that keep memory planning and lowering near linear in the graph's size:
placed buffers by lifetime (the first fit's conflicts), and the last occupant of each
address range (the lowering's memory-reuse dependencies)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
SHORT = 32  # steps: a lifetime this short is searched leaf by leaf, not through the tree


class Lifetimes(Generic[T]):
    """Items with a lifetime [first, last] (steps, both ends included), added one at a time;
    `overlapping` lists those whose lifetime meets a given one in O(log S + answers) for S
    steps, where a scan of all items would make the first fit quadratic.

    An item meets [first, last] when it is live at `first` or starts in (first, last]. A
    segment tree over the steps answers both: each item is filed under the O(log S) nodes
    that tile its lifetime (those on the path from the leaf of `first` to the root hold every
    item live at `first`), and under the leaf of its first step, with counts per node so that
    the walk for (first, last] enters only subtrees that hold a start."""

    def __init__(self, first: int, last: int) -> None:
        self.base = first
        self.size = 1 << max(0, last - first).bit_length()  # leaves for steps first..last
        self.tiles: dict[int, list[T]] = {}  # tree node -> items whose lifetime covers it
        self.starts: dict[int, list[T]] = {}  # leaf -> items starting there
        self.counts = [0] * (2 * self.size)  # tree node -> items starting under it

    def _leaf(self, step: int) -> int:
        assert 0 <= step - self.base < self.size, f"step {step} outside the index"
        return step - self.base + self.size

    def add(self, item: T, first: int, last: int) -> None:
        assert first <= last, f"lifetime [{first}, {last}] ends before it starts"
        lo, hi = self._leaf(first), self._leaf(last) + 1
        while lo < hi:
            if lo & 1:
                self.tiles.setdefault(lo, []).append(item)
                lo += 1
            if hi & 1:
                hi -= 1
                self.tiles.setdefault(hi, []).append(item)
            lo, hi = lo >> 1, hi >> 1
        node = self._leaf(first)
        self.starts.setdefault(node, []).append(item)
        while node:
            self.counts[node] += 1
            node >>= 1

    def overlapping(self, first: int, last: int) -> Iterator[T]:
        """Every item whose lifetime meets [first, last], each once, in no particular order."""
        node = self._leaf(first)
        while node:
            yield from self.tiles.get(node, ())
            node >>= 1
        if last - first > SHORT:
            yield from self._starting(self._leaf(first + 1), self._leaf(last))
        else:  # most lifetimes are a few steps: looking at their leaves is quicker
            for leaf in range(self._leaf(first) + 1, self._leaf(last) + 1):
                yield from self.starts.get(leaf, ())

    def _starting(self, lo: int, hi: int) -> Iterator[T]:
        """Items that start at a leaf in [lo, hi]."""
        stack = [(1, self.size, 2 * self.size - 1)]  # node, its first leaf, its last leaf
        while stack:
            node, first, last = stack.pop()
            if last < lo or first > hi or not self.counts[node]:
                continue
            if node >= self.size:
                yield from self.starts.get(node, ())
                continue
            middle = (first + last) // 2
            stack.append((2 * node + 1, middle + 1, last))
            stack.append((2 * node, first, middle))


class AddressMap:
    """Which item last occupied each byte of an address space: `paint` puts an item over a
    range [start, end), `occupants` lists the items still visible in a range. Stored as
    disjoint segments sorted by address, so both cost O(log n + segments touched)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.owners: list[int] = []

    def _first_touching(self, start: int) -> int:
        """Index of the first segment that ends after `start`."""
        i = bisect.bisect_right(self.starts, start) - 1
        return i if i >= 0 and self.ends[i] > start else i + 1

    def occupants(self, start: int, end: int) -> list[int]:
        """The items visible somewhere in [start, end), in address order (an item may show
        more than once when others cover parts of it)."""
        found = []
        i = self._first_touching(start)
        while i < len(self.starts) and self.starts[i] < end:
            found.append(self.owners[i])
            i += 1
        return found

    def paint(self, start: int, end: int, owner: int) -> None:
        """`owner` now occupies [start, end): what it covers is hidden, parts of segments
        sticking out either side stay visible."""
        i = self._first_touching(start)
        j = i
        while j < len(self.starts) and self.starts[j] < end:
            j += 1
        keep: list[tuple[int, int, int]] = []
        if i < j and self.starts[i] < start:
            keep.append((self.starts[i], start, self.owners[i]))
        keep.append((start, end, owner))
        if i < j and self.ends[j - 1] > end:
            keep.append((end, self.ends[j - 1], self.owners[j - 1]))
        self.starts[i:j] = [s for s, _, _ in keep]
        self.ends[i:j] = [e for _, e, _ in keep]
        self.owners[i:j] = [o for _, _, o in keep]
