"""Shape buckets for dynamic sizes: compiled mode's (torch.compile(dynamic=True),
torch._dynamo.mark_dynamic) and eager ops' sizes that change with the data (MoE routing).

Pure policy: given a symbolic size's value, say which bucket it runs in. A bucket is an
upper bound; one executable is compiled per bucket, at the bound, and runs every size in
it (client/modes/compiled.py, client/door/buckets.py). Powers of two by default;
NEURON_SHAPE_BUCKETS lists the bounds instead ("128,256,512"), or turns bucketing off
("exact": each size compiles on its own). DynamicSizes says which sizes of an eager op are
dynamic.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field


class BucketSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Buckets:
    bounds: tuple[int, ...] = ()  # ascending; empty: powers of two
    exact: bool = False  # no bucketing: every size is its own bucket

    def bound(self, size: int) -> int:
        """The bucket `size` runs in: the smallest bound at least `size`. Past the largest
        listed bound a size is its own bucket (nothing to pad it to)."""
        if self.exact or size <= 0:
            return size
        if not self.bounds:
            return 1 << (size - 1).bit_length()
        i = bisect.bisect_left(self.bounds, size)
        return self.bounds[i] if i < len(self.bounds) else size


def parse(spec: str) -> Buckets:
    """NEURON_SHAPE_BUCKETS: "" or "pow2" (powers of two), "exact", or ascending bounds."""
    spec = spec.strip().lower()
    if spec in ("", "pow2"):
        return Buckets()
    if spec == "exact":
        return Buckets(exact=True)
    try:
        bounds = tuple(int(part) for part in spec.split(","))
    except ValueError:
        bounds = ()
    if not bounds or any(b <= 0 for b in bounds) or list(bounds) != sorted(set(bounds)):
        raise BucketSpecError(
            f"NEURON_SHAPE_BUCKETS={spec!r}: expected 'pow2', 'exact' or ascending positive "
            "sizes, e.g. '128,256,512'"
        )
    return Buckets(bounds)


@dataclass
class _Family:
    seen: deque[tuple[int, ...]]  # the sizes of its signatures met so far (the newest)
    dynamic: frozenset[int] = frozenset()  # positions in the sizes
    marked_by: str = ""  # the values met that made them dynamic ("5, 9, 17, 23, 30, 31, 40")


@dataclass
class DynamicSizes:
    """Which sizes of an eager op are dynamic: dynamo's automatic dynamic shapes, at the level
    of one op. A family is the signatures of one op at one line of the program that are alike
    but for their tensors' sizes (flattened into one tuple: the family's positions). A size
    turns dynamic when the family has met it with `after` different values, everything else
    the same: the positions that differ all held one value and hold another, as a token count
    does wherever it appears. A model's own static shapes seldom do that (its layers of other
    widths change several sizes at once, or meet one line with two or three values); MoE
    routing's and masked selection's sizes do it within a step. Once dynamic, a position is
    bucketed in every later signature of the family."""

    buckets: Buckets
    after: int = 7  # values of one size that make it dynamic
    keep: int = 32  # signatures remembered per family
    _families: dict[Hashable, _Family] = field(default_factory=dict)

    def bucket(self, family: Hashable, sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The sizes to compile a signature met for the first time at: none, it compiles at its
        own (no size of its family is dynamic, or bucketing is off); else its bucket (`sizes`
        with each dynamic position rounded up), then, when a size has just turned dynamic, the
        buckets of the sizes the family met before, so that sizes met again in their ranges
        compile nothing."""
        if self.buckets.exact:
            return []
        known = self._families.setdefault(family, _Family(deque(maxlen=self.keep)))
        was = known.dynamic
        self._mark(known, sizes)
        known.seen.append(sizes)
        if not known.dynamic:
            return []
        at = [self._at(known, sizes)]
        if known.dynamic != was:
            at += [self._at(known, seen) for seen in known.seen]
        at = list(dict.fromkeys(at))  # (each bucket once, this signature's first)
        return [] if at == [sizes] else at

    def dynamic(self, family: Hashable) -> tuple[frozenset[int], str]:
        """The family's dynamic positions and the values of the size that made them so."""
        known = self._families.get(family)
        return (known.dynamic, known.marked_by) if known is not None else (frozenset(), "")

    def _mark(self, known: _Family, sizes: tuple[int, ...]) -> None:
        candidates = {_one_size_changed(seen, sizes) for seen in known.seen}
        for changed in candidates:  # (each set of positions once: a family's misses cost this)
            if not changed or changed <= known.dynamic:
                continue
            values = {sizes[i] for i in changed} | {
                other[min(changed)] for other in known.seen if _one_size_at(other, sizes, changed)
            }
            if len(values) >= self.after:
                known.dynamic |= changed
                known.marked_by = ", ".join(map(str, sorted(values)))

    def _at(self, known: _Family, sizes: tuple[int, ...]) -> tuple[int, ...]:
        bound = self.buckets.bound
        return tuple(bound(n) if i in known.dynamic else n for i, n in enumerate(sizes))


def _one_size_changed(before: tuple[int, ...], after: tuple[int, ...]) -> frozenset[int]:
    """The positions that differ, when they all held one value and now all hold one other;
    else none."""
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    one_before = len({before[i] for i in changed}) == 1
    one_after = len({after[i] for i in changed}) == 1
    return frozenset(changed) if one_before and one_after else frozenset()


def _one_size_at(other: tuple[int, ...], sizes: tuple[int, ...], positions: frozenset[int]) -> bool:
    """Whether `other` is `sizes` but for one value held at `positions`."""
    return len({other[i] for i in positions}) == 1 and all(
        a == b for i, (a, b) in enumerate(zip(other, sizes, strict=True)) if i not in positions
    )
