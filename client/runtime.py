"""The per-process neuron runtime: one simulated core, its memory, timeline and caches."""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.autograd import profiler as autograd_profiler
from trnsim.client import env, profiler, progress, torch_profiler
from trnsim.client.compile_client import CompileClient, make_client
from trnsim.client.errors import compile_error, out_of_memory, user_frame
from trnsim.client.memory import to_host_alias
from trnsim.client.metrics import Metrics
from trnsim.client.ops import Entry, OpSpec
from trnsim.compiler import CompileError, cache_key
from trnsim.compiler.graph import Graph, to_proto
from trnsim.protos import executable_pb2, graph_pb2
from trnsim.simulator import cost_model, execute, shape_only
from trnsim.simulator.config import Target, get_target
from trnsim.simulator.device import Event, Timeline
from trnsim.simulator.memory import Block, HbmAllocator, OutOfMemoryError

DEFAULT_SEED = 67280421310721  # PyTorch's default seed for device generators


class Recording(Protocol):
    """A mode that records ops to run them later as graphs (adaptive: client/recorder.py).
    Eager dispatch offers it each op and view; the runtime flushes it at sync points."""

    region: bool  # it records compiled mode's regions (Runtime.compiled_region)

    @property
    def pending(self) -> bool:
        """Ops are recorded and not yet run."""
        ...

    def offer(
        self, spec: OpSpec, entry: Entry, tensors: list[torch.Tensor], scalars: list[Any]
    ) -> Any:
        """Records the op and returns its results, or NOT_RECORDED: the caller runs it."""
        ...

    def view(
        self, spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> None: ...

    def flush(self, reason: str) -> None:
        """Runs what is recorded."""
        ...


@dataclasses.dataclass
class Bound:
    """A compiled region run inside a shape bucket (client/compiled.py): one executable,
    compiled at the bucket's sizes, runs every size in it. `compile_only`: the region is
    traced at the bucket's sizes to compile that executable (the recorder sets it); nothing
    runs. `cut`: the region did not stay one graph, so the bucket's executable is not its."""

    executable: execute.LoadedExecutable | None = None
    compile_only: bool = False
    cut: str = ""  # why, when it was cut


@dataclasses.dataclass(frozen=True)
class Miss:
    """A compile that missed every cache."""

    key: str
    graph: graph_pb2.Graph
    options: executable_pb2.CompileOptions
    name: str  # the op, or the kind of graph
    ops: int
    where: str  # the user's file:line of its first op


MAX_MISSES = 256


class RegionCut(RuntimeError):
    """A region traced at a bucket's sizes did not stay one graph (client/compiled.py)."""


# The recording modes by name, each registered by its module on import (client/recorder.py:
# "adaptive"; backend.register() imports it): the runtime imports no mode.
RECORDING_MODES: dict[str, Callable[[Runtime], Recording]] = {}
# The recorder of compiled mode's regions (client/recorder.py registers it).
REGION_RECORDER: list[Callable[[Runtime], Recording]] = []


class Runtime:
    def __init__(self, settings: env.Settings) -> None:
        self.settings = settings
        self.target: Target = get_target(settings.target)
        self.core = settings.core
        self.allocator = HbmAllocator(self.target.hbm_bytes)
        self.timeline = Timeline(self.target)
        self.metrics = Metrics()
        self.compiler: CompileClient = make_client()
        self.options = executable_pb2.CompileOptions()  # per-op executables: -O1
        self.fused_options = executable_pb2.CompileOptions(opt_level=2)  # recorded graphs
        self.signatures: dict[tuple[Any, ...], Entry] = {}
        self.executables: dict[str, execute.LoadedExecutable] = {}
        # Background compiles submitted and not finished (progress lines count them): a set,
        # as their callbacks run on the compile thread.
        self._background: set[Future[executable_pb2.Executable]] = set()
        self.generator = torch.Generator()
        self.generator.manual_seed(DEFAULT_SEED)
        self.stream = 0
        self.dispatch_ns = self.target.host_dispatch_op_ns
        self.measured_host = settings.host_costs == "measured"
        self._host_mark = time.perf_counter_ns()
        self._blocks: dict[int, tuple[weakref.ref[Any], Block, int]] = {}
        self._block_keys: dict[int, int] = {}  # data_ptr -> its key in _blocks
        self._parked: dict[int, int] = {}  # data_ptr -> bytes, of storages park()ed
        # data_ptr of each live device storage -> the CPU tensor it was made from (same
        # memory, the allocation's sizes and strides): a cheaper host alias than DLPack.
        self.hosts: dict[int, torch.Tensor] = {}
        # storage data_ptr -> simulated end of a collective writing it that nobody waited
        # for (client/distributed.py): the first op that reads it waits (await_collectives).
        self.awaiting: dict[int, int] = {}
        self.recorder: Recording | None = None  # adaptive mode's (client/recorder.py)
        self._recorder_kept: Recording | None = None  # (its graphs, while in eager mode)
        self._region: Recording | None = None  # compiled mode's (compiled_region)
        self.bound: Bound | None = None  # the shape bucket the current region runs in
        self.region_draws = False  # the current region records CPU-generator draws
        self.profiler: profiler.Profiler | None = None  # (NEURON_PROFILE, torch.neuron.profile)
        if env.profile_path():
            self.profiler = profiler.Profiler(profiler.trace_path(env.profile_path()), self.core)
            atexit.register(self._write_profile)
        # NEURON_RECORD_GRAPHS: every graph compiled or fetched, by cache key, for the
        # precompile manifest written at exit (trnsim precompile compiles it ahead).
        self.graph_log: dict[str, Any] | None = None
        self.misses: collections.deque[Miss] = collections.deque(maxlen=MAX_MISSES)
        # The fused graphs this process asked to compile, by key: (future, host ns asked at).
        self._submitted: dict[str, tuple[Future[executable_pb2.Executable], int]] = {}
        if env.record_graphs():
            self.graph_log = {}
            atexit.register(self._write_manifest)
        self.numerics = settings.numerics
        shape_only.set_numerics(settings.numerics)  # (its hooks: client/explain.py)
        self.set_mode(settings.eager_mode)

    def _write_manifest(self) -> None:
        from trnsim.compiler import manifest

        graphs = dict(self.graph_log or {})  # (a background compile may still add one)
        if graphs:
            path = Path(env.record_graphs())
            n = manifest.merge_into(path, graphs)
            print(
                f"trnsim: {len(graphs)} graphs of this run in {path} ({n} in all); "
                f"compile them ahead with: trnsim precompile {path}",
                file=sys.stderr,
            )
            for key in graphs:
                self.graph_log.pop(key, None)  # type: ignore[union-attr]  # (graphs: not None)

    def _log_graph(
        self,
        key: str,
        graph: graph_pb2.Graph,
        debug: graph_pb2.GraphDebug | None,
        options: executable_pb2.CompileOptions,
    ) -> None:
        if self.graph_log is not None and key not in self.graph_log:
            from trnsim.compiler import manifest

            self.graph_log[key] = manifest.request(graph, debug, self.target.name, options)

    def set_mode(self, mode: str) -> None:
        """eager or adaptive; what was recorded runs first. Graphs seen so far are kept."""
        if mode != "eager" and mode not in RECORDING_MODES:
            raise env.ConfigError(f"eager mode {mode!r}: use 'eager' or 'adaptive'")
        self.flush("sync")
        if mode == "eager":
            if self.recorder is not None:  # (eager twice in a row keeps what was kept)
                self._recorder_kept, self.recorder = self.recorder, None
        elif self.recorder is None:
            self.recorder = self._recorder_kept or RECORDING_MODES[mode](self)
        self.mode = mode

    def close(self) -> None:
        """Runs what was recorded and lets go of the compile daemon's stream: for a runtime
        replaced by another one in the same process (tests, harnesses)."""
        try:
            self.flush("sync")
        finally:
            self.compiler.close()

    def flush(self, reason: str) -> None:
        """Runs whatever the adaptive recorder holds (a sync point or a hazard)."""
        if self.recorder is not None:
            self.recorder.flush(reason)

    # -- memory -------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Block:
        try:
            block = self.allocator.malloc(nbytes)
        except OutOfMemoryError as e:
            raise out_of_memory(e) from None
        self.metrics.counts["allocations"] += 1
        return block

    def adopt(self, tensor: torch.Tensor, block: Block, host: torch.Tensor) -> torch.Tensor:
        """Frees the block when the tensor's storage dies (views keep it alive); remembers
        the CPU tensor whose memory it is until then."""
        self.adopt_storage(tensor.untyped_storage(), block, host)
        return tensor

    def adopt_storage(self, storage: Any, block: Block, host: torch.Tensor) -> None:
        ref = weakref.ref(storage, self._release)
        ptr = storage.data_ptr() if block.requested and not host.is_complex() else 0
        if ptr:
            self.hosts[ptr] = host
            self._block_keys[ptr] = id(ref)
        self._blocks[id(ref)] = (ref, block, ptr)

    def _release(self, ref: weakref.ref[Any]) -> None:
        entry = self._blocks.pop(id(ref), None)
        if entry is not None:
            if self._parked.pop(entry[2], None) is None:  # (a parked one's block is gone)
                self.allocator.free(entry[1])
            if entry[2]:
                self.hosts.pop(entry[2], None)
                self._block_keys.pop(entry[2], None)

    def park(self, storage: Any) -> None:
        """A storage its owner calls freed while keeping the object (FSDP2 resizes an
        unsharded parameter's storage to 0 bytes): its HBM goes back to the allocator. A
        neuron storage cannot change size (PyTorch gives Python backends no storage
        resize), so its host memory stays until unpark() or the storage dies."""
        key = self._block_keys.get(storage.data_ptr(), -1)
        entry = self._blocks.get(key)
        if entry is not None and entry[2] not in self._parked:
            self.flush("hazard")
            self._parked[entry[2]] = entry[1].requested
            self.allocator.free(entry[1])  # (the allocator may hand the Block out again)

    def unpark(self, storage: Any) -> None:
        """The storage is in use again: it takes HBM again (OutOfMemoryError if none)."""
        key = self._block_keys.get(storage.data_ptr(), -1)
        entry = self._blocks.get(key)
        if entry is not None and entry[2] in self._parked:
            block = self.allocate(self._parked.pop(entry[2]))
            self._blocks[key] = (entry[0], block, entry[2])

    def host_alias(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor over a neuron tensor's memory: the allocation's own CPU tensor when
        t is the whole allocation (parameters, op outputs), else a DLPack alias (views)."""
        h = self.hosts.get(t.data_ptr())
        if (
            h is not None
            and h.shape == t.shape
            and h.stride() == t.stride()
            and h.dtype == t.dtype
            and not t.is_neg()  # (complex allocations, which may be conj views, are not kept)
        ):
            return h
        return to_host_alias(t)

    def free_unadopted(self, blocks: list[Block]) -> None:
        for b in blocks:
            if b.allocated:
                self.allocator.free(b)

    # -- executables --------------------------------------------------------------------------
    def executable_for(
        self,
        graph: Graph,
        debug: graph_pb2.GraphDebug,
        options: executable_pb2.CompileOptions | None = None,
    ) -> execute.LoadedExecutable:
        """The loaded executable of a graph: from the in-process cache by key, else compiled
        now (at blocking priority: the op waits for it), at `options` (per-op: -O1)."""
        options = options or self.options
        key = cache_key(graph, self.target, options).digest
        loaded = self.executables.get(key)
        if loaded is not None:
            self.metrics.counts["executable_cache_hits"] += 1
            return loaded
        what = (
            f"{debug.name} (-O{options.opt_level})"
            if len(graph.nodes) == 1
            else f"a {debug.name or ''} graph of {len(graph.nodes)} ops (-O{options.opt_level})"
        )
        try:
            proto = to_proto(graph)
            with progress.compile_wait(what, lambda: len(self._background)) as done:
                exe = self.compiler.compile(proto, self.target.name, options, debug)
                done(exe.modelled_compile_seconds)
        except CompileError as e:
            raise compile_error(debug, e) from e
        self._log_graph(key, proto, debug, options)
        # A daemon's cache hit waited for no compile: fetched, compiled by an earlier run,
        # another process or `trnsim precompile`.
        fetched = exe.waited_compile_seconds == 0 and exe.modelled_compile_seconds > 0
        self.metrics.counts["executables_fetched" if fetched else "executables_compiled"] += 1
        if not fetched:
            self._note_miss(key, proto, options, debug)
        self.wait_for_compile(exe.waited_compile_seconds)
        loaded = self.executables[key] = execute.load(exe)
        return loaded

    def fetch(
        self,
        graph: Graph,
        debug: graph_pb2.GraphDebug,
        options: executable_pb2.CompileOptions,
    ) -> execute.LoadedExecutable | None:
        """The loaded executable of a graph if this process or a shared cache already holds
        it; never compiles (adaptive mode asks for a graph it meets the first time: one that
        `trnsim precompile` or another process compiled runs fused at once)."""
        key = cache_key(graph, self.target, options).digest
        loaded = self.executables.get(key)
        if loaded is not None:
            return loaded
        if key in self._submitted:  # (its own background compile: ready on the compile clock)
            return None
        exe = self.compiler.cached(key) if self.compiler.shared else None
        if exe is None:
            return None
        self._log_graph(key, to_proto(graph), debug, options)
        self.metrics.counts["executables_fetched"] += 1
        loaded = self.executables[key] = execute.load(exe)
        return loaded

    def _note_miss(
        self,
        key: str,
        proto: graph_pb2.Graph,
        options: executable_pb2.CompileOptions,
        debug: graph_pb2.GraphDebug,
    ) -> None:
        """A compile that missed every cache (torch.neuron.explain() says what differed from
        the nearest cached key): the newest MAX_MISSES are kept."""
        where = debug.node_locations[0] if debug.node_locations else None
        line = f"{where.file}:{where.line}" if where is not None else ""
        self.misses.append(Miss(key, proto, options, debug.name or "graph", len(proto.nodes), line))

    def wait_for_compile(self, seconds: float) -> None:
        """The host waits for the modelled compile time it needs (NEURON_SIM_COMPILE_CLOCK)."""
        ns = self.compile_delay_ns(seconds)
        if ns:
            self.timeline.host_work(ns)
            self.metrics.counts["compile_wait_ns"] += ns

    def compile_delay_ns(self, seconds: float) -> int:
        """Simulated ns a compile that waited `seconds` (modelled) costs; 0 with the
        compile clock off (NEURON_SIM_COMPILE_CLOCK=off)."""
        return int(seconds * 1e9) if self.settings.compile_clock and seconds > 0 else 0

    @property
    def host_ns(self) -> int:
        """The simulated host clock."""
        return int(self.timeline.host_ns)

    def submit(
        self, graph: Graph, debug: graph_pb2.GraphDebug
    ) -> tuple[Future[executable_pb2.Executable], int]:
        """A compile at background priority and -O2 (adaptive mode's fused graphs): nothing
        waits for it; the future holds the executable, or the compile's error. Returns it with
        the host time it was asked for. A graph asked for again (another recorded graph with
        the same program) shares the first request: one compile, ready at one time on the
        simulated clock, whenever the real compile ends."""
        proto = to_proto(graph)
        key = cache_key(graph, self.target, self.fused_options).digest
        asked = self._submitted.get(key)
        if asked is not None:
            return asked
        future = self.compiler.compile_async(proto, self.target.name, self.fused_options, debug)
        asked = self._submitted[key] = (future, self.host_ns)
        if self.graph_log is not None:  # (still compiling at exit: precompile finishes it)
            self._log_graph(key, proto, debug, self.fused_options)
            log = self.graph_log

            def drop_if_refused(f: Future[executable_pb2.Executable]) -> None:
                if f.cancelled() or f.exception() is not None:  # not one to compile again
                    log.pop(key, None)

            future.add_done_callback(drop_if_refused)

        def note_if_compiled(f: Future[executable_pb2.Executable]) -> None:
            if f.cancelled() or f.exception() is not None:
                return
            exe = f.result()
            if not (exe.waited_compile_seconds == 0 and exe.modelled_compile_seconds > 0):
                self._note_miss(key, proto, self.fused_options, debug)

        future.add_done_callback(note_if_compiled)
        self._background.add(future)
        future.add_done_callback(self._background.discard)
        return asked

    @property
    def compiles_shared(self) -> bool:
        """Whether compiles land in a cache other processes share (a daemon's)."""
        return self.compiler.shared

    @contextlib.contextmanager
    def compiled_region(
        self, bound: Bound | None = None, draws_in_order: bool = False
    ) -> Iterator[None]:
        """Ops inside the block are one compiled region (client/compiled.py): recorded by
        the region recorder whatever the eager mode, and run at the block's end. What the
        mode's own recorder holds runs first (stream order). `bound`: the region runs in a
        shape bucket's executable (or is traced to compile it). `draws_in_order`: nothing
        in the block draws from the CPU's generator but the ops it records (which then
        draw in the order they were issued)."""
        self.flush("compiled_region")
        previous = self.recorder
        if self._region is None:
            self._region = REGION_RECORDER[0](self)
        self.recorder = self._region
        self.bound = bound
        self.region_draws = draws_in_order
        try:
            yield
        except BaseException as e:
            if bound is not None and bound.compile_only:
                bound.cut = bound.cut or f"{type(e).__name__}: {e}"  # (nothing of it runs)
            raise
        finally:
            try:
                self._region.flush("region_end")  # (after an error too: those ops were issued)
            finally:
                self.recorder = previous
                self.bound = None
                self.region_draws = False

    def _write_profile(self) -> None:
        if self.profiler is not None:
            path = self.profiler.write()
            if path is not None:
                print(f"trnsim: profile written to {path} (trnsim profile {path})", file=sys.stderr)

    # -- timeline -----------------------------------------------------------------------------
    def launch(
        self,
        loaded: execute.LoadedExecutable,
        host_ns: int | None = None,
        where: Callable[[], list[tuple[str, int, str]]] | None = None,
    ) -> None:
        """Enqueues an executable on the current stream, after the host's work to launch it:
        `host_ns` when given (a recorded graph's submit), else an eager op's dispatch
        (modelled, or the real time since the last launch with NEURON_SIM_HOST=measured).
        `where`: the source line of each node of the graph it was compiled from (for the
        profiler; default: the caller's line)."""
        timeline = self.timeline
        timeline.host_work(host_ns if host_ns is not None else self._dispatch_cost())
        if loaded.modelled_ns:
            start = timeline.enqueue(loaded.modelled_ns, self.stream, loaded.engine_ns)
            self.metrics.counts["hbm_bytes"] += loaded.hbm_bytes
            # (the per-op path: two attribute reads when nothing profiles)
            on = self.profiler is not None or autograd_profiler._is_profiler_enabled
            profilers = self.profilers() if on else ()
            if profilers:
                sources = where() if where is not None else [user_frame()]
                overhead = self.target.launch_overhead_ns
                for prof in profilers:
                    prof.launch(loaded, start, overhead, self.stream, sources)

    def profilers(self) -> list[profiler.Profiler]:
        """Who records launches now: trnsim's profiler (NEURON_PROFILE, torch.neuron.profile)
        and a torch.profiler session's (client/torch_profiler.py)."""
        sink = torch_profiler.sink(self.core)
        if self.profiler is None:
            return [sink] if sink is not None else []
        return [self.profiler] if sink is None else [self.profiler, sink]

    def _dispatch_cost(self) -> int:
        """The host's ns to dispatch one op: modelled, or with NEURON_SIM_HOST=measured the
        real time since the last launch."""
        if not self.measured_host:
            return self.dispatch_ns
        now = time.perf_counter_ns()
        cost, self._host_mark = now - self._host_mark, now
        return cost

    def launch_priced(
        self, name: str, duration_ns: int, engine_ns: dict[str, int], hbm_bytes: int
    ) -> None:
        """launch() of work priced without an executable (a sparse op: its engines busy at
        once), with the same accounting: the host's dispatch, the queue, HBM traffic and the
        profile at the caller's line."""
        self.timeline.host_work(self._dispatch_cost())
        start = self.timeline.enqueue(duration_ns, self.stream, engine_ns)
        self.metrics.counts["hbm_bytes"] += hbm_bytes
        profilers = self.profilers()
        if profilers:
            path, line, _ = user_frame()
            overhead = self.target.launch_overhead_ns
            for prof in profilers:
                prof.engines(name, start, overhead, engine_ns, self.stream, f"{path}:{line}")

    def await_collectives(self, tensors: list[torch.Tensor]) -> None:
        """The current stream waits for the collectives writing any of these tensors (an
        output read through a future, as DDP reads its buckets, rather than after
        work.wait()). Entries for collectives already over on the host's clock go."""
        awaiting = self.awaiting
        for t in tensors:
            if not t.is_cpu:
                end = awaiting.pop(t.untyped_storage().data_ptr(), None)
                if end is not None:
                    self.timeline.stream_wait_event(Event(end), self.stream)
        host = self.timeline.host_ns
        for ptr in [p for p, end in awaiting.items() if end <= host]:
            del awaiting[ptr]

    def host_work(self, ns: int) -> None:
        """Host time spent on the runtime's own work (recording an op, say)."""
        self.timeline.host_work(ns)

    def queue_depth(self, stream: int | None = None) -> int:
        """Launches not yet finished in simulated time (on one stream, or all)."""
        return self.timeline.queue_depth(stream)

    @contextlib.contextmanager
    def on_stream(self, stream: int) -> Iterator[None]:
        """Launches inside the block go to `stream`; the current stream is restored after.
        (rt.stream is the one place the current stream is held: torch.neuron's Stream
        objects and the recorder read it.)"""
        previous, self.stream = self.stream, stream
        try:
            yield
        finally:
            self.stream = previous

    def count(self, name: str, n: int = 1) -> None:
        counts = self.metrics.counts
        counts[name] = counts.get(name, 0) + n

    # -- verbs over the timeline and the allocator (torch.neuron, the process group) -----------
    # Thin: each reads or moves one thing of the simulated core and flushes nothing (its
    # caller decides whether recorded work runs first).
    def now_ns(self) -> int:
        """Simulated wall time: the later of the host and every queue's end."""
        return self.timeline.now_ns()

    def ready_ns(self, stream: int) -> int:
        """When work submitted now on `stream` could start (host time or the stream's end)."""
        return self.timeline.ready_ns(stream)

    def device_busy_ns(self) -> int:
        """Busy time summed over every stream."""
        return self.timeline.device_busy_ns()

    def occupy(self, stream: int, start_ns: int, duration_ns: int, engine: str) -> None:
        """Work whose start was agreed elsewhere (a collective) runs on `stream` from start_ns."""
        self.timeline.occupy(stream, start_ns, duration_ns, engine)

    def wait_until(self, time_ns: int) -> None:
        """The host waits until time_ns (counted as a sync wait)."""
        self.timeline.wait_until(time_ns)

    def record_event(self, event: Event, stream: int) -> None:
        """The event completes when the work enqueued so far on `stream` completes."""
        self.timeline.record_event(event, stream)

    def wait_event(self, event: Event, stream: int) -> None:
        """Later work on `stream` waits for the event (a device-side wait)."""
        self.timeline.stream_wait_event(event, stream)

    def event_query(self, event: Event) -> bool:
        """Whether the event has completed on the host's clock (unrecorded: yes)."""
        return self.timeline.event_query(event)

    def event_synchronize(self, event: Event) -> None:
        """The host waits for the event."""
        self.timeline.event_synchronize(event)

    def allocated_bytes(self) -> int:
        return self.allocator.allocated_bytes

    def peak_allocated_bytes(self) -> int:
        return self.allocator.peak_allocated_bytes

    def reserved_bytes(self) -> int:
        return self.allocator.reserved_bytes

    def memory_capacity(self) -> int:
        """The core's HBM, bytes."""
        return self.allocator.capacity

    def memory_limit(self) -> int:
        """The bytes this process may reserve (set_memory_limit)."""
        return self.allocator.limit

    def set_memory_limit(self, nbytes: int) -> None:
        """Caps reserved memory: past it the allocator frees cached blocks and retries."""
        self.allocator.limit = nbytes

    def memory_stats(self) -> dict[str, int]:
        """The allocator's counters, cached and fragmented bytes, capacity (HbmAllocator.stats)."""
        return self.allocator.stats()

    def memory_snapshot(self) -> list[dict[str, object]]:
        """Every segment and its blocks, in address order (HbmAllocator.snapshot)."""
        return self.allocator.snapshot()

    def reset_peak_stats(self) -> None:
        self.allocator.reset_peak_stats()

    def reset_accumulated_stats(self) -> None:
        """The allocator's historical counts (allocations, frees, OOMs...) back to 0."""
        self.allocator.reset_accumulated_stats()

    def empty_cache(self) -> None:
        """Releases every cached segment that holds no allocated block."""
        self.allocator.empty_cache()

    def synchronize(self, stream: int | None = None) -> None:
        self.flush("sync")
        self.timeline.synchronize(stream)

    def host_to_device(self, nbytes: int, from_pinned: bool = False) -> None:
        """A host->device copy. From pageable memory the host is busy for the transfer; a
        non_blocking copy from pinned memory is a DMA on the current stream instead."""
        if from_pinned:
            self._copy_dma("h2d", nbytes)
        else:
            self.timeline.host_work(int(cost_model.host_transfer_ns(self.target, nbytes)))
        self.metrics.counts["h2d_bytes"] += nbytes

    def device_to_host(self, nbytes: int, to_pinned: bool = False) -> None:
        """A device->host copy. The host waits for the device, then for the transfer; a
        non_blocking copy into pinned memory is a DMA on the current stream after the work
        before it, which the host does not wait for (synchronize() does)."""
        if to_pinned:
            self.flush("sync")  # the recorded work that makes the data runs first
            self._copy_dma("d2h", nbytes)
        else:
            self.synchronize()  # flushes the recorder too
            self.timeline.host_work(int(cost_model.host_transfer_ns(self.target, nbytes)))
        self.metrics.counts["d2h_bytes"] += nbytes

    def _copy_dma(self, direction: str, nbytes: int) -> None:
        """A non_blocking copy with pinned host memory: the host submits a DMA on the current
        stream and goes on (counted as <direction>_async_bytes)."""
        ns = int(cost_model.host_transfer_ns(self.target, nbytes))
        self.timeline.host_work(self.target.host_submit_ns)
        self.timeline.launch(
            ns, stream=self.stream, name=direction, engine_ns={"dma": ns}, overhead_ns=0
        )
        self.metrics.counts[f"{direction}_async_bytes"] += nbytes

    def snapshot(self) -> dict[str, int]:
        self.flush("sync")
        counts, times = self.metrics.counts, self.timeline.snapshot()
        assert not counts.keys() & times.keys(), counts.keys() & times.keys()  # one source each
        return {**counts, **times}

    def reset_metrics(self) -> None:
        """Every counter and busy time to zero (pending recorded work is counted first); the
        clocks (host_ns, wall_ns) go on."""
        self.flush("sync")
        self.metrics.reset()
        self.timeline.reset_counters()


_runtime: Runtime | None = None
_init_lock = threading.Lock()


def get() -> Runtime:
    global _runtime
    if _runtime is None:
        with _init_lock:
            if _runtime is None:
                _runtime = Runtime(env.read())
    return _runtime


def initialized() -> bool:
    return _runtime is not None
