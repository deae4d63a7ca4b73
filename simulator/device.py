"""The simulated timeline of one core: host time, in-order device queues, engine busy time.

docs/ARCHITECTURE.md, "Two clocks": each launch starts at max(host time of the launch, end of the previous
work on its queue) and lasts its launch overhead plus its modelled time; a sync point moves
the host to the end of the work it waits for. Everything here is deterministic.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import NamedTuple

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


@dataclass
class _Queue:
    end_ns: int = 0
    # End times of launches not known to be finished (non-decreasing); entries at or before
    # the host time are dropped as the host moves on, so the deque stays short.
    ends: deque[int] = field(default_factory=deque)
    busy_ns: int = 0


class Timeline:
    """Host and device time of one simulated core."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.host_ns = 0
        self.host_busy_ns = 0
        self.sync_waits = 0
        self.sync_wait_ns = 0
        self.launches = 0
        self.engine_busy_ns: dict[str, int] = defaultdict(int)
        self._queues: dict[int, _Queue] = defaultdict(_Queue)
        # Collectives on the timeline (start, end), latest last, and the compute time that
        # ran while one did: how much communication the device hid behind compute.
        self._collective_spans: deque[tuple[int, int]] = deque()
        self.collective_overlap_ns = 0

    # -- host side ----------------------------------------------------------------------------
    def host_work(self, ns: int) -> None:
        """The host spends ns (dispatching, recording, submitting)."""
        self.host_ns += ns
        self.host_busy_ns += ns

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
        return Launch(stream, name, self.host_ns, start, self._queues[stream].end_ns)

    def enqueue(
        self,
        duration_ns: int,
        stream: int,
        engine_ns: dict[str, int],
        overhead_ns: int = -1,
        host_ns: int = 0,
    ) -> int:
        """launch() without the record (the runtime's per-op path): the work starts when
        the host submits it (after host_ns of host work: host_work, in the same call) or
        the stream's earlier work ends, whichever is later, and takes the launch overhead
        (the target's, unless given) plus duration_ns. Returns its start."""
        overhead = self.target.launch_overhead_ns if overhead_ns < 0 else overhead_ns
        queue = self._queues[stream]
        if host_ns:
            self.host_busy_ns += host_ns
            self.host_ns += host_ns
        host = self.host_ns
        start = queue.end_ns if queue.end_ns > host else host  # noqa: FURB136  (per op: no call)
        end = start + overhead + duration_ns
        queue.end_ns = end
        ends = queue.ends
        ends.append(end)
        while ends[0] <= host:
            ends.popleft()
        queue.busy_ns += end - start
        spans = self._collective_spans
        if spans:  # compute launched while collectives run or are queued
            while spans and spans[0][1] <= start:
                spans.popleft()
            for c_start, c_end in spans:
                self.collective_overlap_ns += max(0, min(end, c_end) - max(start, c_start))
        self.launches += 1
        busy = self.engine_busy_ns
        for engine, ns in engine_ns.items():
            busy[engine] += ns
        return start

    def ready_ns(self, stream: int) -> int:
        """When work submitted now on a stream could start: the host's time or the end of
        the stream's earlier work, whichever is later."""
        return max(self.host_ns, self.stream_end_ns(stream))

    def occupy(self, stream: int, start_ns: int, duration_ns: int, engine: str) -> None:
        """Work whose start was agreed elsewhere (a collective: the last rank's arrival) runs
        on a stream from start_ns, which is no earlier than the stream's ready time."""
        queue = self._queues[stream]
        if start_ns < max(self.host_ns, queue.end_ns):
            raise ValueError(
                f"work on stream {stream} cannot start at {start_ns} ns, before it is ready"
            )
        end = start_ns + duration_ns
        queue.end_ns = end
        queue.ends.append(end)
        queue.busy_ns += duration_ns
        self.engine_busy_ns[engine] += duration_ns
        spans = self._collective_spans
        if spans and start_ns < spans[-1][1]:  # (another group's, still running: one span)
            spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
        else:
            spans.append((start_ns, end))

    def queue_depth(self, stream: int | None = None) -> int:
        """Launches submitted and not yet finished at the current host time."""
        streams = [stream] if stream is not None else list(self._queues)
        return sum(self._pending(self._queues[s]) for s in streams if s in self._queues)

    def _pending(self, queue: _Queue) -> int:
        ends = queue.ends
        while ends and ends[0] <= self.host_ns:
            ends.popleft()
        return len(ends)

    def stream_end_ns(self, stream: int = 0) -> int:
        return self._queues[stream].end_ns if stream in self._queues else 0

    def device_busy_ns(self, stream: int | None = None) -> int:
        if stream is not None:
            return self._queues[stream].busy_ns if stream in self._queues else 0
        return sum(q.busy_ns for q in self._queues.values())

    # -- synchronisation ----------------------------------------------------------------------
    def synchronize(self, stream: int | None = None) -> int:
        """The host waits for a stream (or every stream); returns the ns it waited."""
        streams = [stream] if stream is not None else list(self._queues)
        end = max((self.stream_end_ns(s) for s in streams), default=0)
        return self.wait_until(end)

    def wait_until(self, time_ns: int) -> int:
        self.sync_waits += 1
        waited = max(0, time_ns - self.host_ns)
        self.host_ns += waited
        self.sync_wait_ns += waited
        return waited

    def record_event(self, event: Event, stream: int = 0) -> None:
        """The event completes when the work enqueued so far on the stream completes."""
        event.time_ns = max(self.host_ns, self.stream_end_ns(stream))

    def stream_wait_event(self, event: Event, stream: int = 0) -> None:
        """Later work on the stream waits for the event (a device-side wait; host unblocked)."""
        if event.time_ns is None:
            return  # waiting on an unrecorded event is a no-op, as in CUDA
        queue = self._queues[stream]
        queue.end_ns = max(queue.end_ns, event.time_ns)

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
        self.host_busy_ns = self.sync_waits = self.sync_wait_ns = self.launches = 0
        self.collective_overlap_ns = 0
        self.engine_busy_ns.clear()
        for queue in self._queues.values():
            queue.busy_ns = 0

    # -- summary ------------------------------------------------------------------------------
    def now_ns(self) -> int:
        """Simulated wall time: the later of the host and every queue's end."""
        return max([self.host_ns, *(q.end_ns for q in self._queues.values())])

    def snapshot(self) -> dict[str, int]:
        return {
            "host_ns": self.host_ns,
            "host_busy_ns": self.host_busy_ns,
            "wall_ns": self.now_ns(),
            "device_busy_ns": self.device_busy_ns(),
            "launches": self.launches,
            "sync_waits": self.sync_waits,
            "sync_wait_ns": self.sync_wait_ns,
            "collective_overlap_ns": self.collective_overlap_ns,
            **{f"{e}_busy_ns": self.engine_busy_ns.get(e, 0) for e in ENGINES},
        }
