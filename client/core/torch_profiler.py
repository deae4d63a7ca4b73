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
to do this (the wrap_* functions; client/api/patches.py puts them in place).
"""

from __future__ import annotations

import bisect
import functools
import gzip
import itertools
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import torch
from torch.autograd import profiler as autograd_profiler
from torch.autograd.profiler_util import FunctionEvent
from trnsim.client.core import profiler
from trnsim.client.core.profiler import TraceEvent

MARK = "neuron::launch"  # the marker's name in tables and traces
MAX_EVENTS = profiler.MAX_EVENTS  # per session; later launches get no device time (said once)
_ids = itertools.count(1)
_lock = threading.Lock()
_sink: Sink | None = None
Events = list[TraceEvent]  # one launch's trace events: the launch first, then its parts
Profile = autograd_profiler.profile  # the session whose methods are wrapped here


class Sink(profiler.Profiler):
    """The launches of one torch.profiler session, by marker id."""

    def __init__(self, core: int) -> None:
        super().__init__(None, core)
        self.launches: dict[int, Events] = {}
        self._kept = 0

    def _add(self, events: Events) -> None:
        if self._kept + len(events) > MAX_EVENTS:
            if not self._full:
                self._full = True
                profiler.log.warning(
                    "torch.profiler: %d device events recorded; later launches have no device time",
                    MAX_EVENTS,
                )
            return
        lid = next(_ids)
        with torch.autograd.profiler.record_function(f"{MARK}#{lid}"):
            self.launches[lid] = events
        self._kept += len(events)


def sink(core: int) -> Sink | None:
    """The current session's sink while a torch.profiler session records, else None."""
    global _sink
    if not autograd_profiler._is_profiler_enabled:
        return None
    with _lock:
        if _sink is None:
            _sink = Sink(core)
        return _sink


def _take() -> dict[int, Events]:
    global _sink
    with _lock:
        taken, _sink = (_sink.launches if _sink is not None else {}), None
    return taken


def wrap_exit(
    exit_: Callable[..., bool | None], synchronize: Callable[[], None]
) -> Callable[..., bool | None]:
    """profile.__exit__: the launches of the cycle are taken before torch parses it (with
    acc_events it parses inside __exit__); what was recorded but not launched runs first
    (`synchronize`: the runtime's, if there is one)."""

    @functools.wraps(exit_)
    def __exit__(self: Profile, *exc: object) -> bool | None:
        if self.enabled:
            try:
                synchronize()
            finally:
                self._neuron_launches = _take()
        return exit_(self, *exc)

    return __exit__


def wrap_ensure_function_events(ensure: Callable[..., None]) -> Callable[..., None]:
    """profile._ensure_function_events: the launches join the events once they are parsed."""

    @functools.wraps(ensure)
    def _ensure_function_events(self: Profile) -> None:
        fresh = self._function_events is None
        ensure(self)
        if fresh and self._function_events is not None:
            _merge(self)

    return _ensure_function_events


def wrap_export_chrome_trace(export: Callable[..., object]) -> Callable[..., object]:
    """profile.export_chrome_trace: the launches join kineto's trace."""

    @functools.wraps(export)
    def export_chrome_trace(self: Profile, path: str, *args: object, **kwargs: object) -> object:
        out = export(self, path, *args, **kwargs)
        launches = getattr(self, "_neuron_launches", None)
        if launches and self.use_device == torch._C._get_privateuse1_backend_name():
            _add_to_trace(Path(path), launches)
        return out

    return export_chrome_trace


def _marker_id(name: object) -> int | None:
    if not isinstance(name, str) or not name.startswith(MARK + "#"):
        return None
    try:
        return int(name[len(MARK) + 1 :])
    except ValueError:
        return None


def _place(
    markers: list[tuple[float, int]], launches: dict[int, Events]
) -> list[tuple[int, float]]:
    """(launch id, start µs) for each marker (host µs, id) whose launch was kept: at the
    host's issue time, or when the previous launch on its device row ends if that is later."""
    placed = []
    free: dict[tuple[object, object], float] = {}  # per device row: when its last launch ends
    for at, lid in sorted(markers):
        events = launches.get(lid)
        if not events:
            continue
        row = (events[0]["pid"], events[0]["tid"])
        start = max(at, free.get(row, at))
        free[row] = start + float(events[0]["dur"])
        placed.append((lid, start))
    return placed


def _merge(prof: Profile) -> None:
    """Renames this parse's markers to MARK; with the device activity, each launch becomes a
    kernel of the op that issued it and a device event."""
    events = prof._function_events
    assert events is not None  # (called once they are parsed)
    launches = getattr(prof, "_neuron_launches", {})
    device = prof.use_device == torch._C._get_privateuse1_backend_name()
    markers: dict[int, FunctionEvent] = {}
    for fe in events:
        lid = _marker_id(fe.name)
        if lid is not None:
            fe.name = fe.trace_name = MARK
            markers[lid] = fe
    if not device:
        return
    placed = _place([(fe.time_range.start, lid) for lid, fe in markers.items()], launches)
    next_id = max((e.id for e in events), default=0) + 1
    for lid, start in placed:
        head, marker = launches[lid][0], markers[lid]
        end = start + float(head["dur"])
        owner = marker.cpu_parent or marker  # the op that launched it, as for CUDA
        owner.append_kernel(head["name"], marker.device_index, end - start)
        events.append(
            FunctionEvent(
                id=next_id,
                name=head["name"],
                thread=0,
                start_us=start,
                end_us=end,
                input_shapes=[],
                stack=[],
                use_device=prof.use_device,
                device_type=torch.autograd.DeviceType.PrivateUse1,
                device_index=head["pid"],
            )
        )
        next_id += 1


def _add_to_trace(path: Path, launches: dict[int, Events]) -> None:
    """kineto's trace at `path` (gzipped if it ends in .gz), with device rows for the
    launches whose markers it holds, placed from the markers' own timestamps."""
    opener: Callable[..., IO[str]] = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    out = data["traceEvents"] if isinstance(data, dict) else data
    markers: dict[int, TraceEvent] = {}
    for e in out:
        lid = _marker_id(e.get("name"))
        if lid is not None:
            e["name"] = MARK
            e.setdefault("args", {})["launch"] = lid
            markers[lid] = e
    placed = _place([(float(m["ts"]), lid) for lid, m in markers.items()], launches)
    cores = set()
    for lid, start in placed:
        events, marker = launches[lid], markers[lid]
        shift = start - float(events[0]["ts"])  # simulated µs -> the trace's µs
        for ev in events:
            out.append(dict(ev, ts=float(ev["ts"]) + shift))
            cores.add(ev["pid"])
        flow = {"id": lid, "cat": "ac2g", "name": "ac2g"}  # an arrow: host launch -> device
        head = events[0]
        out.append(dict(flow, ph="s", pid=marker["pid"], tid=marker["tid"], ts=marker["ts"]))
        out.append(dict(flow, ph="f", bp="e", pid=head["pid"], tid=head["tid"], ts=start))
    out.extend(_ranges(out, placed, launches, markers))
    for core in sorted(cores):
        name = {"name": f"neuron core {core}"}
        out.append({"name": "process_name", "ph": "M", "pid": core, "args": name})
    tmp = path.with_name(path.name + ".tmp")
    with opener(tmp, "wt") as f:
        json.dump(data, f)
    tmp.replace(path)


def _ranges(
    out: list[TraceEvent],
    placed: list[tuple[int, float]],
    launches: dict[int, Events],
    markers: dict[int, TraceEvent],
) -> list[TraceEvent]:
    """Each record_function range on the device: from the start of the first launch issued
    inside it to the end of the last."""
    issued = sorted((float(markers[lid]["ts"]), start, lid) for lid, start in placed)
    times = [t for t, _, _ in issued]
    ranges = []
    for e in out:
        if e.get("cat") != "user_annotation" or e.get("ph") != "X" or e.get("name") == MARK:
            continue
        lo, hi = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))
        inside = issued[bisect.bisect_left(times, lo) : bisect.bisect_right(times, hi)]
        if not inside:
            continue
        start = min(s for _, s, _ in inside)
        end = max(s + float(launches[lid][0]["dur"]) for _, s, lid in inside)
        ranges.append(
            {
                "name": e["name"],
                "cat": "neuron_user_annotation",
                "ph": "X",
                "ts": start,
                "dur": end - start,
                "pid": launches[inside[0][2]][0]["pid"],
                "tid": "annotations",
            }
        )
    return ranges
