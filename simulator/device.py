"""The simulated timeline of one core: host time, in-order device queues, engine busy time.

docs/ARCHITECTURE.md, "Two clocks": each launch starts at max(host time of the launch, end of the previous
work on its queue) and lasts its launch overhead plus its modelled time; a sync point moves
the host to the end of the work it waits for. Everything here is deterministic. The arithmetic is C++
(accounting.h, shared with the C++ door); this module is its Python face.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from trnsim.simulator import native
from trnsim.simulator.config import Target

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma", "collective")


class Launch(NamedTuple):
    """One piece of work on a queue: an executable, a transfer or a collective."""

    stream: int
    name: str
    host_ns: int  # host time when it was submitted
    start_ns: int
    end_ns: int


@dataclass
class Event:
    """A point on a stream's queue; `time_ns` is None until it has been recorded."""

    time_ns: int | None = None

    def recorded(self) -> bool:
        return self.time_ns is not None


class Timeline:
    """Host and device time of one simulated core. The clocks and queues are C++ (`core`,
    accounting.h: the C++ door launches a warm eager call on them without Python); this
    class gives them events, launch records and the snapshot."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.core = native.module().Timeline(target.launch_overhead_ns)

    # -- the clocks and counters (C++) --------------------------------------------------------
    @property
    def host_ns(self) -> int:
        return int(self.core.host_ns)

    @property
    def host_busy_ns(self) -> int:
        return int(self.core.host_busy_ns)

    @property
    def sync_waits(self) -> int:
        return int(self.core.sync_waits)

    @property
    def sync_wait_ns(self) -> int:
        return int(self.core.sync_wait_ns)

    @property
    def launches(self) -> int:
        return int(self.core.launches)

    @property
    def hbm_bytes(self) -> int:
        """Bytes the launched work moves to and from HBM (modelled)."""
        return int(self.core.hbm_bytes)

    @property
    def collective_overlap_ns(self) -> int:
        """Compute time that ran while a collective did: communication hidden by compute."""
        return int(self.core.collective_overlap_ns)

    # -- host side ----------------------------------------------------------------------------
    def host_work(self, ns: int) -> None:
        """The host spends ns (dispatching, recording, submitting)."""
        self.core.host_work(ns)

    # -- device side --------------------------------------------------------------------------
    def launch(
        self,
        duration_ns: int,
        *,
        stream: int = 0,
        name: str = "",
        engine_ns: dict[str, int] | None = None,
        overhead_ns: int | None = None,
    ) -> Launch:
        """Enqueues work of duration_ns (+ the launch overhead) on a stream's in-order queue."""
        if duration_ns < 0:
            raise ValueError(f"negative duration {duration_ns} ns for launch {name!r}")
        overhead = self.target.launch_overhead_ns if overhead_ns is None else overhead_ns
        start = self.enqueue(duration_ns, stream, engine_ns or {}, overhead)
        return Launch(stream, name, self.host_ns, start, self.stream_end_ns(stream))

    def enqueue(
        self,
        duration_ns: int,
        stream: int,
        engine_ns: dict[str, int],
        overhead_ns: int = -1,
        host_ns: int = 0,
        hbm_bytes: int = 0,
    ) -> int:
        """launch() without the record (the runtime's per-op path): the work starts when
        the host submits it (after host_ns of host work: host_work, in the same call) or
        the stream's earlier work ends, whichever is later, and takes the launch overhead
        (the target's, unless given) plus duration_ns; it moves hbm_bytes to and from HBM.
        Returns its start."""
        return int(
            self.core.enqueue(duration_ns, stream, engine_ns, overhead_ns, host_ns, hbm_bytes)
        )

    def ready_ns(self, stream: int) -> int:
        """When work submitted now on a stream could start: the host's time or the end of
        the stream's earlier work, whichever is later."""
        return int(self.core.ready_ns(stream))

    def occupy(self, stream: int, start_ns: int, duration_ns: int, engine: str) -> None:
        """Work whose start was agreed elsewhere (a collective: the last rank's arrival) runs
        on a stream from start_ns, which is no earlier than the stream's ready time
        (ValueError if it is)."""
        self.core.occupy(stream, start_ns, duration_ns, engine)

    def queue_depth(self, stream: int | None = None) -> int:
        """Launches submitted and not yet finished at the current host time."""
        return int(self.core.queue_depth(stream))

    def stream_end_ns(self, stream: int = 0) -> int:
        return int(self.core.stream_end_ns(stream))

    def device_busy_ns(self, stream: int | None = None) -> int:
        return int(self.core.device_busy_ns(stream))

    def engine_busy_ns(self, engine: str) -> int:
        """The busy time launches gave an engine (tensor, vector, ... ENGINES)."""
        return int(self.core.engine_busy_ns(engine))

    # -- synchronisation ----------------------------------------------------------------------
    def synchronize(self, stream: int | None = None) -> int:
        """The host waits for a stream (or every stream); returns the ns it waited."""
        return int(self.core.synchronize(stream))

    def wait_until(self, time_ns: int) -> int:
        return int(self.core.wait_until(time_ns))

    def record_event(self, event: Event, stream: int = 0) -> None:
        """The event completes when the work enqueued so far on the stream completes."""
        event.time_ns = self.ready_ns(stream)

    def stream_wait_event(self, event: Event, stream: int = 0) -> None:
        """Later work on the stream waits for the event (a device-side wait; host unblocked)."""
        if event.time_ns is None:
            return  # waiting on an unrecorded event is a no-op, as in CUDA
        self.core.stream_wait(stream, event.time_ns)

    def event_query(self, event: Event) -> bool:
        return event.time_ns is None or event.time_ns <= self.host_ns

    def event_synchronize(self, event: Event) -> int:
        return self.wait_until(event.time_ns) if event.time_ns is not None else 0

    @staticmethod
    def elapsed_ns(start: Event, end: Event) -> int:
        if start.time_ns is None or end.time_ns is None:
            raise RuntimeError("both events must be recorded before elapsed time is read")
        return end.time_ns - start.time_ns

    def reset_counters(self) -> None:
        """Launches, sync waits and busy times back to zero; the clocks (host time, queue
        ends) go on, so work in flight still finishes when it would have."""
        self.core.reset_counters()

    # -- summary ------------------------------------------------------------------------------
    def now_ns(self) -> int:
        """Simulated wall time: the later of the host and every queue's end."""
        return int(self.core.now_ns())

    def snapshot(self) -> dict[str, int]:
        core = self.core
        return {
            "host_ns": self.host_ns,
            "host_busy_ns": self.host_busy_ns,
            "wall_ns": self.now_ns(),
            "device_busy_ns": self.device_busy_ns(),
            "launches": self.launches,
            "sync_waits": self.sync_waits,
            "sync_wait_ns": self.sync_wait_ns,
            "collective_overlap_ns": self.collective_overlap_ns,
            "hbm_bytes": self.hbm_bytes,
            **{f"{e}_busy_ns": int(core.engine_busy_ns(e)) for e in ENGINES},
        }
