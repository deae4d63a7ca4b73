"""The simulated chip inside PyTorch's own profiler (torch.profiler with the PrivateUse1
activity, `ProfilerActivity.PrivateUse1`).

A real accelerator's profiler plugin is C++ (a kineto IActivityProfiler); trnsim's device
lives in Python, so it joins the profile from both ends instead:

- while a torch.profiler session records, each launch on the simulated chip (and each
  collective) enters a zero-length `record_function` marker named `neuron::launch`, as a
  CUDA launch leaves `cudaLaunchKernel`, and keeps its simulated events (the same ones
  `torch.neuron.profile` writes: the launch, its instructions on their engines);
- when the session's events are parsed (`key_averages()`, `table()`, `events()`), each
  marker's launch becomes a device event (`DeviceType.PrivateUse1`) and a kernel of the op
  that issued it, so the op's row has "Self NEURON" and "NEURON total" time, and a
  `record_function` range gets the device time of the launches inside it;
- `export_chrome_trace()` adds the launches, their instructions, flow arrows from each
  marker and the `record_function` ranges as device rows to kineto's trace.

One time axis: a device event has its simulated duration, and starts when its launch was
issued on the host's clock, or when the previous launch on its row ends if that is later
(the host ran ahead). Host times are real (trnsim's own Python included); device times are
the chip's. torch.profiler.profile's __exit__, event parsing and trace export are wrapped
to do this (install(), once).
"""

from __future__ import annotations

import functools
import itertools
import json
import threading
from pathlib import Path
from typing import Any

import torch
from torch.autograd import profiler as autograd_profiler
from torch.autograd.profiler_util import FunctionEvent
from trnsim.client import profiler

MARK = "neuron::launch"  # the marker's name in tables and traces
MAX_LAUNCHES = 200_000  # per session; later launches get no device event (said once)
_ids = itertools.count(1)
_lock = threading.Lock()
_sink: Sink | None = None


class Sink(profiler.Profiler):
    """The launches of one torch.profiler session, by marker id."""

    def __init__(self, core: int) -> None:
        super().__init__(None, core)
        self.launches: dict[int, list[dict[str, Any]]] = {}

    def _add(self, events: list[dict[str, Any]]) -> None:
        if len(self.launches) >= MAX_LAUNCHES:
            if not self._full:
                self._full = True
                profiler.log.warning(
                    "torch.profiler: %d launches recorded; later ones have no device time",
                    MAX_LAUNCHES,
                )
            return
        lid = next(_ids)
        with torch.autograd.profiler.record_function(f"{MARK}#{lid}"):
            self.launches[lid] = events


def sink(core: int) -> Sink | None:
    """The current session's sink while a torch.profiler session records, else None."""
    global _sink
    if not autograd_profiler._is_profiler_enabled:
        return None
    with _lock:
        if _sink is None:
            _sink = Sink(core)
        return _sink


def _take() -> dict[int, list[dict[str, Any]]]:
    global _sink
    with _lock:
        taken, _sink = (_sink.launches if _sink is not None else {}), None
    return taken


def install() -> None:
    """Wraps torch.autograd.profiler.profile (what torch.profiler.profile drives) once."""
    cls = autograd_profiler.profile
    if getattr(cls, "_trnsim_wrapped", False):
        return
    cls._trnsim_wrapped = True
    exit_, ensure, export = cls.__exit__, cls._ensure_function_events, cls.export_chrome_trace

    @functools.wraps(exit_)
    def __exit__(self: Any, *exc: Any) -> Any:
        out = exit_(self, *exc)
        if self.enabled:
            self._neuron_launches = {**getattr(self, "_neuron_launches", {}), **_take()}
        return out

    @functools.wraps(ensure)
    def _ensure_function_events(self: Any) -> None:
        fresh = self._function_events is None
        ensure(self)
        if fresh and self._function_events is not None:
            self._neuron_placed = _merge(self)

    @functools.wraps(export)
    def export_chrome_trace(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        out = export(self, path, *args, **kwargs)
        if getattr(self, "_neuron_launches", None) and self.kineto_results is not None:
            _add_to_trace(self, Path(path))
        return out

    cls.__exit__ = __exit__  # type: ignore[method-assign]
    cls._ensure_function_events = _ensure_function_events  # type: ignore[method-assign]
    cls.export_chrome_trace = export_chrome_trace  # type: ignore[method-assign]


class Placed:
    """A launch placed on the host's time axis (µs since the profile's start)."""

    def __init__(self, lid: int, marker: FunctionEvent, start: float, events: list[Any]) -> None:
        self.lid, self.marker, self.start, self.events = lid, marker, start, events
        self.end = start + float(events[0]["dur"])
        self.shift = start - float(events[0]["ts"])  # simulated µs → profile µs


def _marker_id(fe: FunctionEvent) -> int | None:
    name = fe.name
    if not name.startswith(MARK + "#"):
        return None
    try:
        return int(name[len(MARK) + 1 :])
    except ValueError:
        return None


def _merge(prof: Any) -> list[Placed]:
    """Device events and kernels for the markers among the parsed events (renamed to
    MARK); returns the launches placed."""
    events = prof._function_events
    launches = getattr(prof, "_neuron_launches", {})
    device = prof.use_device == torch._C._get_privateuse1_backend_name()
    markers = []
    for fe in events:
        lid = _marker_id(fe)
        if lid is not None:
            fe.name = fe.trace_name = MARK
            if device and lid in launches:
                markers.append((lid, fe))
    placed: list[Placed] = []
    free: dict[Any, float] = {}  # per device row: when its last launch ends
    for lid, fe in sorted(markers, key=lambda m: m[1].time_range.start):
        evs = launches[lid]
        row = (evs[0]["pid"], evs[0]["tid"])
        p = Placed(lid, fe, max(fe.time_range.start, free.get(row, 0.0)), evs)
        free[row] = p.end
        placed.append(p)
    if not placed:
        return placed
    next_id = max((e.id for e in events), default=0) + 1
    added = []
    for p in placed:
        head = p.events[0]
        owner = p.marker.cpu_parent or p.marker  # the op that launched it, as for CUDA
        owner.append_kernel(head["name"], p.marker.device_index, p.end - p.start)
        added.append(_device_event(prof, next_id, head["name"], p.start, p.end, head["pid"]))
        next_id += 1
    for fe in added:
        events.append(fe)
    return placed


_CPU = torch.autograd.DeviceType.CPU


def _device_event(
    prof: Any, eid: int, name: str, start: float, end: float, core: int
) -> FunctionEvent:
    return FunctionEvent(
        id=eid,
        name=name,
        thread=0,
        start_us=start,
        end_us=end,
        input_shapes=[],
        stack=[],
        use_device=prof.use_device,
        device_type=torch.autograd.DeviceType.PrivateUse1,
        device_index=core,
    )


def _ranges(prof: Any, placed: list[Placed]) -> list[tuple[str, float, float, int]]:
    """Each record_function range on the device: from the start of the first launch issued
    inside it to the end of the last (name, start, end, core)."""
    out = []
    for ann in prof._function_events:
        if not ann.is_user_annotation or ann.name == MARK or ann.device_type != _CPU:
            continue
        lo, hi = ann.time_range.start, ann.time_range.end
        inside = [p for p in placed if lo <= p.marker.time_range.start <= hi]
        if inside:
            core = inside[0].events[0]["pid"]
            out.append((ann.name, min(p.start for p in inside), max(p.end for p in inside), core))
    return out


def _add_to_trace(prof: Any, path: Path) -> None:
    """kineto's trace at `path`, with the device rows of the placed launches added."""
    if prof._needs_processing or prof._function_events is None:
        prof._ensure_function_events()
    placed: list[Placed] = getattr(prof, "_neuron_placed", [])
    data = json.loads(path.read_text())
    out = data["traceEvents"]
    # FunctionEvent µs count from the profile's start; the trace's from baseTimeNanoseconds.
    offset = (prof.kineto_results.trace_start_ns() - int(data.get("baseTimeNanoseconds", 0))) / 1e3
    markers = {}
    for e in out:
        name = e.get("name")
        if isinstance(name, str) and name.startswith(MARK + "#"):
            lid = int(name[len(MARK) + 1 :])
            e["name"] = MARK
            e.setdefault("args", {})["launch"] = lid
            markers[lid] = e
    cores = set()
    for p in placed:
        for ev in p.events:
            moved = dict(ev, ts=float(ev["ts"]) + p.shift + offset)
            out.append(moved)
            cores.add(ev["pid"])
        marker = markers.get(p.lid)
        if marker is not None:  # an arrow from the host's launch to the device's
            head = p.events[0]
            flow = {"id": p.lid, "cat": "ac2g", "name": "ac2g"}
            out.append(dict(flow, ph="s", pid=marker["pid"], tid=marker["tid"], ts=marker["ts"]))
            out.append(
                dict(flow, ph="f", bp="e", pid=head["pid"], tid=head["tid"], ts=p.start + offset)
            )
    for name, start, end, core in _ranges(prof, placed):
        out.append(
            {
                "name": name,
                "cat": "neuron_user_annotation",
                "ph": "X",
                "ts": start + offset,
                "dur": end - start,
                "pid": core,
                "tid": "annotations",
            }
        )
    for core in cores:
        out.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": core,
                "args": {"name": f"neuron core {core}"},
            }
        )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
