"""The wall time a benchmark rank spends waiting in blocking compiles (the compile part of
its time to first step): benchmarks/ttfs_rank.py and benchmarks/scale_rank.py."""

from __future__ import annotations

import time


def time_compiles() -> list[float]:
    """Wall seconds this rank spends waiting in blocking compiles (the compile part of its
    time to first step), accumulated in the returned list's one item."""
    from trnsim.client.core import runtime

    client = runtime.get().compiler
    compile_blocking = client.compile
    spent = [0.0]

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return compile_blocking(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    client.compile = timed  # type: ignore[method-assign]
    return spent
