"""Counters of the neuron runtime: public API (torch.neuron.metrics()); tests assert them."""

from __future__ import annotations

COUNTERS = (
    "ops_dispatched",  # ops that reached the backend (views included)
    "view_ops",  # metadata-only ops (no executable, no launch)
    "allocations",  # device tensors allocated
    "executables_compiled",  # compiles this process asked for
    "cache_hits",  # ops whose signature was already in the in-process cache
    "cache_misses",  # ops that needed an executable looked up or compiled
    "executable_cache_hits",  # signature misses served by an executable already loaded
    "launches",  # executables enqueued on the device
    "sync_waits",  # times the host waited for the device
    "h2d_bytes",
    "d2h_bytes",
    "dynamic_shape_ops",  # ops whose output shape depends on data (a sync point)
)


class Metrics:
    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    def reset(self) -> None:
        for name in self.counts:
            self.counts[name] = 0
