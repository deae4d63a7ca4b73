"""torch.neuron's streams and events (torch.cuda.streams' Stream and Event, and the current
stream), on the simulated core's timeline."""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator

import torch
from trnsim.client.api.device_base import DeviceLike
from trnsim.client.api.device_base import flushed as _flushed
from trnsim.client.core import runtime
from trnsim.simulator import device as sim_device

_stream_ids = itertools.count(1)


class Stream:
    """An in-order queue of the simulated core; work on different streams may overlap."""

    def __init__(
        self, device: DeviceLike | None = None, priority: int = 0, *, _id: int | None = None
    ) -> None:
        self.stream_id = next(_stream_ids) if _id is None else _id
        self.priority = priority

    @property
    def device(self) -> torch.device:
        return torch.device("neuron", 0)

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream id={self.stream_id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("neuron-stream", self.stream_id))

    def synchronize(self) -> None:
        runtime.get().synchronize(self.stream_id)

    def query(self) -> bool:
        return _flushed().queue_depth(self.stream_id) == 0

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        _flushed().wait_event(event._event, self.stream_id)

    def wait_stream(self, stream: Stream) -> None:
        self.wait_event(stream.record_event())


_default = Stream(_id=0)
# The current stream is the runtime's (rt.stream, an id: what launches go to). These are the
# Stream objects behind the ids, so that current_stream() gives back the one that was set.
_streams: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary({0: _default})


def default_stream(device: DeviceLike | None = None) -> Stream:
    return _default


def current_stream(device: DeviceLike | None = None) -> Stream:
    stream_id = runtime.get().stream
    s = _streams.get(stream_id)
    if s is None:  # (its object was dropped while current: an equal one stands in)
        s = _streams[stream_id] = Stream(_id=stream_id)
    return s


def set_stream(stream: Stream) -> None:
    _streams[stream.stream_id] = stream
    runtime.get().stream = stream.stream_id


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[Stream | None]:
    """Work issued inside the block goes to stream s (None: no change)."""
    if s is None:
        yield s
        return
    _streams[s.stream_id] = s
    with runtime.get().on_stream(s.stream_id):
        yield s


class Event:
    """A marker on a stream's queue, in simulated time."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self.enable_timing = enable_timing
        self._event = sim_device.Event()

    def record(self, stream: Stream | None = None) -> None:
        s = stream or current_stream()
        _flushed().record_event(self._event, s.stream_id)

    def wait(self, stream: Stream | None = None) -> None:
        (stream or current_stream()).wait_event(self)

    def query(self) -> bool:
        return _flushed().event_query(self._event)

    def synchronize(self) -> None:
        _flushed().event_synchronize(self._event)

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds of simulated time between this event and end_event."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Events were not created with enable_timing=True")
        return sim_device.Timeline.elapsed_ns(self._event, end_event._event) / 1e6
