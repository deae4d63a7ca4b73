"""The per-process neuron runtime: one simulated core, its memory, timeline and caches."""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import torch
from torch.autograd import profiler as autograd_profiler
from trnsim.client.core import env, profiler, torch_profiler
from trnsim.client.core.compile_client import CompileClient, make_client
from trnsim.client.core.device_memory import DeviceMemory
from trnsim.client.core.errors import user_frame
from trnsim.client.core.executables import Executables
from trnsim.client.core.metrics import Metrics
from trnsim.client.core.ops import Entry, OpSpec
from trnsim.client.core.types import Args, Kwargs, OpValue
from trnsim.policy import buckets
from trnsim.simulator import cost_model, execute, shape_only
from trnsim.simulator.config import Target, get_target
from trnsim.simulator.device import Event, Timeline
from trnsim.simulator.memory import HbmAllocator

DEFAULT_SEED = 67280421310721  # PyTorch's default seed for device generators


class Recording(Protocol):
    """A mode that records ops to run them later as graphs (adaptive mode: client/modes/adaptive.py;
    compiled regions: client/modes/region.py). The door (client/door/kernel.py) offers it each op and
    view; the runtime flushes it at sync points."""

    # An op signature first met while it records compiles its own executable only if it is
    # ever run on its own (a compiled region runs its ops inside the region's executable).
    defers_op_compiles: bool

    @property
    def pending(self) -> bool:
        """Ops are recorded and not yet run."""
        ...

    def offer(
        self, spec: OpSpec, entry: Entry, tensors: list[torch.Tensor], scalars: list[float]
    ) -> OpValue:
        """Records the op and returns its results, or NOT_RECORDED: the caller runs it."""
        ...

    def view(self, spec: OpSpec, args: Args, kwargs: Kwargs, result: OpValue) -> None: ...

    def flush(self, reason: str) -> None:
        """Runs what is recorded."""
        ...


# The recording modes by name ("adaptive": client/modes/adaptive.py), given by the layer above when
# it registers the device (client/api/backend.py): the runtime imports no mode.
RECORDING_MODES: dict[str, Callable[[Runtime], Recording]] = {}
# Called with the runtime after its mode or recorder is set (the C++ door's,
# client/door/fast.py).
MODE_HOOKS: list[Callable[[Runtime], None]] = []


class Runtime:
    def __init__(self, settings: env.Settings) -> None:
        self.settings = settings
        self.target: Target = get_target(settings.target)
        self.core = settings.core
        self.metrics = Metrics()
        self.count = self.metrics.count  # the one counting verb (every counter declared)
        # (the per-op paths add to declared counters here, a dict update instead of a call)
        self.counts = self.metrics.counts
        self.memory = DeviceMemory(HbmAllocator(self.target.hbm_bytes), self.flush, self.counts)
        self.timeline = Timeline(self.target)
        self._clock = self.timeline.core  # (launch's per-op path: the C++ timeline itself)
        self.compiler: CompileClient = make_client()
        self.signatures: dict[tuple[object, ...], Entry] = {}
        # Eager ops whose sizes change with the data compile per shape bucket
        # (client/door/buckets.py).
        self.dynamic_sizes = buckets.DynamicSizes(buckets.parse(env.shape_buckets()))
        self.generator = torch.Generator()
        self.generator.manual_seed(DEFAULT_SEED)
        self.stream = 0
        self.dispatch_ns = self.target.host_dispatch_op_ns
        self.measured_host = settings.host_costs == "measured"
        self._host_mark = time.perf_counter_ns()
        # storage data_ptr -> simulated end of a collective writing it that nobody waited
        # for (client/distributed/): the first op that reads it waits (await_collectives).
        self.awaiting: dict[int, int] = {}
        self.recorder: Recording | None = None  # the slot: the recording mode taking ops now
        # Every recorder made, by mode ("adaptive", "region"): kept with its graphs while
        # another mode runs.
        self.recorders: dict[str, Recording] = {}
        self.profiler: profiler.Profiler | None = None  # (NEURON_PROFILE, torch.neuron.profile)
        if env.profile_path():
            self.profiler = profiler.Profiler(profiler.trace_path(env.profile_path()), self.core)
            atexit.register(self._write_profile)
        self.executables = Executables(
            self.compiler, self.target, self.timeline, self.metrics, settings.compile_clock
        )
        self.numerics = settings.numerics
        shape_only.set_numerics(settings.numerics)  # (its hooks: client/core/notes.py)
        self.set_mode(settings.eager_mode)

    def set_mode(self, mode: str) -> None:
        """eager or adaptive; what was recorded runs first. Graphs seen so far are kept."""
        if mode != "eager" and mode not in RECORDING_MODES:
            raise env.ConfigError(f"eager mode {mode!r}: use 'eager' or 'adaptive'")
        self.flush("sync")
        if mode == "eager":
            self.recorder = None
        else:
            recorder = self.recorders.get(mode)
            if recorder is None:
                recorder = self.recorders[mode] = RECORDING_MODES[mode](self)
            self.recorder = recorder
        self.mode = mode
        for hook in MODE_HOOKS:
            hook(self)

    def close(self) -> None:
        """Runs what was recorded and lets go of the compile daemon's stream: for a runtime
        replaced by another one in the same process (tests, harnesses)."""
        try:
            self.flush("sync")
        finally:
            self.compiler.close()

    def flush(self, reason: str) -> None:
        """Runs whatever the recorder in the slot holds (a sync point or a hazard)."""
        if self.recorder is not None:
            self.recorder.flush(reason)

    @property
    def host_ns(self) -> int:
        """The simulated host clock."""
        return int(self.timeline.host_ns)

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
        if host_ns is None:
            host_ns = self._dispatch_cost() if self.measured_host else self.dispatch_ns
        start = self._clock.launch_cost(loaded.cost, self.stream, host_ns)  # (-1: nothing ran)
        if start >= 0:
            # (the per-op path: two attribute reads when nothing profiles)
            on = self.profiler is not None or autograd_profiler._is_profiler_enabled
            profilers = self.profilers() if on else ()
            if profilers:
                sources = where() if where is not None else [user_frame()]
                overhead = self.target.launch_overhead_ns
                for prof in profilers:
                    prof.launch(loaded, start, overhead, self.stream, sources)

    def door_launches(self) -> bool:
        """Whether the C++ door may launch an eager op on the timeline itself, as launch()
        does: nothing profiles (a profiler wants the launch's source line) and host time is
        modelled (client/door/fast.py)."""
        return not (
            self.measured_host
            or self.profiler is not None
            or autograd_profiler._is_profiler_enabled
        )

    def profilers(self) -> list[profiler.Profiler]:
        """Who records launches now: trnsim's profiler (NEURON_PROFILE, torch.neuron.profile)
        and a torch.profiler session's (client/core/torch_profiler.py)."""
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
        start = self.timeline.enqueue(duration_ns, self.stream, engine_ns, hbm_bytes=hbm_bytes)
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

    # -- verbs over the timeline (torch.neuron's streams and events, the process group) -------
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
        self.count("h2d_bytes", nbytes)

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
        self.count("d2h_bytes", nbytes)

    def _copy_dma(self, direction: str, nbytes: int) -> None:
        """A non_blocking copy with pinned host memory: the host submits a DMA on the current
        stream and goes on (counted as <direction>_async_bytes)."""
        ns = int(cost_model.host_transfer_ns(self.target, nbytes))
        self.timeline.host_work(self.target.host_submit_ns)
        self.timeline.launch(
            ns, stream=self.stream, name=direction, engine_ns={"dma": ns}, overhead_ns=0
        )
        self.count(f"{direction}_async_bytes", nbytes)

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
