"""Shape buckets for compiled mode's dynamic dimensions (torch.compile(dynamic=True),
torch._dynamo.mark_dynamic).

Pure policy: given a symbolic size's value, say which bucket it runs in. A bucket is an
upper bound; one executable is compiled per bucket, at the bound, and runs every size in
it (client/modes/compiled.py). Powers of two by default; NEURON_SHAPE_BUCKETS lists the bounds
instead ("128,256,512"), or turns bucketing off ("exact": each size compiles on its own).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


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
