"""Counters of the neuron runtime: public API (torch.neuron.metrics()); tests assert them.

What the timeline counts (launches, sync waits, busy times) it alone counts
(simulator/device.py Timeline.snapshot): each key has one source."""

from __future__ import annotations

COUNTERS = (
    "ops_dispatched",  # ops that reached the backend (views included)
    "view_ops",  # metadata-only ops (no executable, no launch)
    "allocations",  # device tensors allocated
    "executables_compiled",  # compiles this process asked for and waited for
    "executables_fetched",  # executables it asked for that a daemon's cache held (no wait)
    "cache_hits",  # ops whose signature was already in the in-process cache
    "cache_misses",  # ops that needed an executable looked up or compiled
    "executable_cache_hits",  # signature misses served by an executable already loaded
    "compile_wait_ns",  # simulated host time spent waiting for compiles (modelled times)
    "h2d_bytes",
    "h2d_async_bytes",  # of those, non_blocking copies from pinned memory (DMA, host goes on)
    "d2h_bytes",
    "d2h_async_bytes",  # of those, non_blocking copies into pinned memory (DMA, host goes on)
    "dynamic_shape_ops",  # ops whose output shape depends on data (a sync point)
    # eager op signatures run in a shape bucket's executable (one size of the op at one line
    # took several values): computed at their size, priced at the bucket's (client/door/buckets.py)
    "op_bucket_signatures",
    "op_buckets_refused",  # of those, ones the op could not be traced or compiled at
    "sparse_ops",  # ops on sparse tensors: each one launch (client/door/sparse.py)
    # Adaptive mode (NEURON_EAGER=adaptive); cut reasons are counted as cut_<reason>.
    "ops_recorded",
    "graphs_formed",
    "op_by_op_graphs",  # graphs run op by op (first sight, or their fused compile not ready)
    "op_by_op_ops",
    "fused_executions",  # graphs run as one fused executable
    "fused_ops",  # ops those fused executions covered
    "fused_compiles_requested",
    "fused_compiles_ready",
    # graphs met the first time whose fused executable a daemon's cache already held (trnsim
    # precompile, another process): fused at once, nothing requested
    "fused_graphs_fetched",
    "fused_compiles_failed",
    "fused_fallbacks",  # graphs whose fused executable failed once: op by op from then on
    "internal_outputs",  # recorded outputs nobody could observe: never in HBM
    # Compiled mode (torch.compile(backend="neuron"), client/modes/compiled.py).
    "compiled_dynamo_graphs",  # graphs dynamo handed the backend (recompiles included)
    "compiled_forward_graphs",  # AOTAutograd's graphs, by kind
    "compiled_backward_graphs",
    "compiled_inference_graphs",
    "compiled_calls",  # runs of those graphs (regions)
    # of those, run as one prepared callable without tracing (client/modes/prepared.py)
    "compiled_replays",
    "compiled_graphs_ready",  # regions compiled at the fused level
    "compiled_buckets",  # shape buckets whose one executable compiled (client/modes/region.py)
    "compiled_buckets_refused",  # buckets that could not be one executable: sizes compile
    "compiled_bucket_runs",  # regions run in a bucket's executable
    "compiled_fallbacks",  # graphs AOTAutograd could not lower: run in the eager mode
    # torch.distributed on the neuron backend (client/distributed/).
    "collectives",  # collectives and point-to-point transfers on the collective queues
    "collective_bytes",  # the bytes they were priced for
)


# Families of counters named at run time: cut_<reason> (why a recorded graph was cut,
# client/api/explain.py REASONS).
FAMILIES = ("cut_",)


class Metrics:
    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    def count(self, name: str, n: int = 1) -> None:
        """The one way to count: a declared counter (COUNTERS) or one of a family."""
        try:  # (every op counts: the declared case costs one dict update)
            self.counts[name] += n
        except KeyError:
            if not name.startswith(FAMILIES):
                raise KeyError(
                    f"counter {name!r} is not declared in client/core/metrics.py COUNTERS"
                ) from None
            self.counts[name] = n

    def reset(self) -> None:
        for name in list(self.counts):
            if name in COUNTERS:
                self.counts[name] = 0
            else:
                del self.counts[name]
