"""Compiled mode's regions (client/modes/compiled.py): the ops of one FX graph's run are recorded
whole into the buffer (client/modes/tape.py), cut only where they must be (a hazard, a
data-dependent shape, an op the compiler cannot take, an op signature never run), and at the
region's end compiled at once at the fused level if new, then launched. Its ops cost the
simulated host nothing to record: a native compiled runtime launches the graph, it does not
trace it again.

A region may run inside a shape bucket (Bound): one executable, compiled at the bucket's
sizes, runs every size in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
from trnsim.client.core import runtime
from trnsim.client.core.ops import NOT_RECORDED, Entry, OpSpec
from trnsim.client.core.types import OpValue
from trnsim.client.modes.prepared import Traced
from trnsim.client.modes.recording import GraphState, Recorder
from trnsim.client.modes.tape import Cut
from trnsim.compiler.graph import to_proto
from trnsim.policy import boundaries
from trnsim.simulator import execute


@dataclasses.dataclass
class Bound:
    """A compiled region run inside a shape bucket: one executable, compiled at the bucket's
    sizes, runs every size in it. `compile_only`: the region is traced at the bucket's sizes
    to compile that executable; nothing runs. `cut`: the region did not stay one graph, so
    the bucket's executable is not its."""

    executable: execute.LoadedExecutable | None = None
    compile_only: bool = False
    cut: str = ""  # why, when it was cut


class RegionCut(RuntimeError):
    """A region traced at a bucket's sizes did not stay one graph."""


# Ops whose CPU kernels can return outputs of other shapes than their Meta kernels say
# (batch norm in eval returns empty save_mean/save_invstd on the CPU, embedding_bag empty
# offsets...): found by running every OpInfo sample (forward and backward) on the CPU and on
# meta. A region runs each on its own the first time, to see what it really returns.
SHAPES_DIFFER_FROM_META = frozenset(
    [
        "aten::native_batch_norm.default",
        "aten::_native_batch_norm_legit.default",
        "aten::_native_batch_norm_legit.no_stats",
        "aten::_native_batch_norm_legit_no_training.default",
        "aten::_embedding_bag_forward_only.default",
        "aten::_embedding_bag.default",
    ]
)


class Region(Recorder):
    """The recorder of compiled mode's regions. `bound` and `draws` hold for the region being
    recorded (compiled_region sets them): its shape bucket, and whether nothing in it draws
    from the CPU's generator but the ops it records (which then draw in issue order)."""

    defers_op_compiles = True  # (its ops run inside the region's executable)

    def __init__(self, rt: runtime.Runtime) -> None:
        super().__init__(rt, boundaries.Policy(size_cap=1 << 30, drain_min_ops=1 << 30))
        self.bound: Bound | None = None
        self.draws = False
        self.traced: Traced | None = None  # what this region call does, kept to prepare it

    def offer(
        self, spec: OpSpec, entry: Entry, tensors: list[torch.Tensor], scalars: list[float]
    ) -> OpValue:
        result = super().offer(spec, entry, tensors, scalars)
        traced = self.traced
        if traced is not None:
            traced.offered += 1
            traced.not_recorded += result is NOT_RECORDED
        return result

    def _verified(self, spec: OpSpec, entry: Entry) -> bool:
        # An op signature never run is recorded too (its metadata is the Meta kernels', as
        # the compiled graph's is), unless the CPU kernel may give outputs of other shapes:
        # then it runs on its own first, as in adaptive mode.
        return entry.verified or spec.name not in SHAPES_DIFFER_FROM_META

    def _fusible(self, entry: Entry) -> bool:
        # A draw from the CPU's generator keeps its place in a region nothing else in which
        # draws from it: the region runs at its end, in order, with no user code between.
        return entry.fusible or (entry.cpu_draw and self.draws)

    def _cutting(self, spec: OpSpec, cut: boundaries.Cut) -> None:
        bound = self.bound
        if bound is not None and bound.compile_only:  # (nothing of that trace may run)
            bound.cut = f"cut ({cut.value})"
            raise RegionCut(f"{spec.name} cuts the region ({cut.value})")

    def flush(self, reason: str) -> None:
        if not self.tape.ops:
            return
        traced = self.traced
        # (what the buffer read, described: holding the tensors would keep them alive)
        read = traced.read(self.tape.inputs, self.rt) if traced is not None else []
        cut = self.tape.take()
        bound = self.bound
        if bound is not None and (reason != "region_end" or bound.cut):
            bound.cut = bound.cut or f"cut ({reason})"
            if bound.compile_only:  # (a trace at the bucket's sizes: nothing of it runs)
                if reason == "region_end":
                    return
                raise RegionCut(f"the region is cut before its end ({reason})")
            bound = None  # it runs as regions without a bucket do
        if bound is not None and bound.compile_only:
            graph, debug = cut.graph("compiled")
            bound.executable = self.rt.executables.get(graph, debug, fused=True)
            self.rt.count("compiled_buckets")
            return
        self.rt.count("graphs_formed")
        self.rt.count(f"cut_{reason}")
        state = self._state(cut)
        if state.loaded is None and not state.fallback:
            if bound is not None and bound.executable is not None:
                # A size inside a compiled bucket: the bucket's executable, run at this size
                # (the graph as recorded here gives its numerics; nothing compiles).
                graph, debug = cut.graph("compiled")
                state.loaded = bound.executable.at_size(to_proto(graph), debug)
                state.history.requested = state.history.ready = True
            else:
                self._compile_now(state, cut)
        if bound is not None:
            self.rt.count("compiled_bucket_runs")
        self._run(state, cut)
        self._account(cut)
        if traced is not None:  # (a cut before the end is only counted: holding its ops
            # or host aliases would keep memory alive longer than an untraced run does)
            kept = dataclasses.replace(cut, input_hosts=[]) if reason == "region_end" else None
            traced.flushes.append((reason, kept, state, read))

    def _compile_now(self, state: GraphState, cut: Cut) -> None:
        """A region's graph, compiled now at the fused level (the step waits, as for a
        torch.compile'd graph). If the compiler refuses it, it runs op by op from now on."""
        if not cut.launches:
            return
        graph, debug = cut.graph("compiled")
        try:
            loaded = self.rt.executables.get(graph, debug, fused=True)
        except Exception as e:  # noqa: BLE001  (a graph the compiler cannot take: op by op)
            self._fall_back(state, e)
            return
        self.rt.count("compiled_graphs_ready")
        state.loaded = loaded
        state.history.requested = state.history.ready = True


@contextlib.contextmanager
def compiled_region(
    rt: runtime.Runtime,
    bound: Bound | None = None,
    draws_in_order: bool = False,
    traced: Traced | None = None,
) -> Iterator[None]:
    """Ops inside the block are one compiled region: recorded by the region recorder
    whatever the eager mode, and run at the block's end. What the mode's own recorder holds
    runs first (stream order). `bound`: the region runs in a shape bucket's executable (or is
    traced to compile it). `draws_in_order`: nothing in the block draws from the CPU's
    generator but the ops it records (which then draw in the order they were issued).
    `traced`: filled with what the block did (client/modes/prepared.py)."""
    rt.flush("compiled_region")
    previous = rt.recorder
    region = rt.recorders.get("region")
    if not isinstance(region, Region):
        region = rt.recorders["region"] = Region(rt)
    rt.recorder = region
    for hook in runtime.MODE_HOOKS:  # (the C++ door steps aside: client/door/fast.py)
        hook(rt)
    region.bound, region.draws, region.traced = bound, draws_in_order, traced
    if traced is not None:
        counts = rt.metrics.counts
        traced.dispatched, traced.views = counts["ops_dispatched"], counts["view_ops"]
        traced.allocations = counts["allocations"]
    try:
        yield
    except BaseException as e:
        if bound is not None and bound.compile_only:
            bound.cut = bound.cut or f"{type(e).__name__}: {e}"  # (nothing of it runs)
        raise
    finally:
        try:
            region.flush("region_end")  # (after an error too: those ops were issued)
        finally:
            rt.recorder = previous
            for hook in runtime.MODE_HOOKS:
                hook(rt)
            region.bound, region.draws, region.traced = None, False, None
