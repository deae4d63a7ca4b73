"""The profiler: where the simulated chip's time goes, launch by launch and engine by
engine, with the user's source lines (the trace format is simulator/trace.py's).

`NEURON_PROFILE=trace.json` profiles the whole process and writes the trace at exit
("{rank}" in the name is the torchrun rank; without it a rank's trace gets "-rank<N>").
`with torch.neuron.profile("trace.json") as prof:` profiles a block (the file is optional);
`prof.summary()` is the table `trnsim profile trace.json` prints.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trnsim.simulator import execute, trace

log = logging.getLogger(__name__)
TraceEvent = dict[str, Any]  # one Chrome trace event as simulator/trace.py makes it (JSON)
MAX_EVENTS = 2_000_000  # then the trace stops growing (said once): a long run's profile


class Profiler:
    def __init__(self, path: str | None, core: int) -> None:
        self.path = Path(path) if path else None
        self.core = core
        self.events: list[TraceEvent] = []
        self._full = False

    def launch(
        self,
        loaded: execute.LoadedExecutable,
        start_ns: int,
        overhead_ns: int,
        stream: int,
        sources: list[tuple[str, int, str]],
    ) -> None:
        """One launch; `sources`: the source line of each node of the graph it ran (the
        graph compiled; an executable of a bucket runs the same program at other sizes)."""
        exe = (loaded.bound or loaded).executable
        nodes = exe.graph.nodes
        if len(nodes) == 1:
            name = nodes[0].op
        else:
            kind = loaded.executable.debug.graph.name
            name = f"{kind + ' ' if kind else ''}graph ({len(loaded.steps)} ops)"
        where = [f"{path}:{line}" if line else "" for path, line, _ in sources]
        self._add(trace.launch_events(exe, start_ns, overhead_ns, stream, self.core, name, where))

    def engines(
        self,
        name: str,
        start_ns: int,
        overhead_ns: int,
        engine_ns: dict[str, int],
        stream: int,
        source: str,
    ) -> None:
        """A launch priced by engine without an executable (a sparse op)."""
        self._add(
            trace.engine_launch_events(
                name, start_ns, overhead_ns, engine_ns, stream, self.core, source
            )
        )

    def collective(
        self, kind: str, start_ns: int, duration_ns: int, nbytes: int, source: str
    ) -> None:
        self._add([trace.collective_event(kind, start_ns, duration_ns, nbytes, self.core, source)])

    def _add(self, events: list[TraceEvent]) -> None:
        if self._full:
            return
        if len(self.events) + len(events) > MAX_EVENTS:
            self._full = True
            log.warning("the profile holds %d events: later launches are not in it", MAX_EVENTS)
            return
        self.events.extend(events)

    def summary(self, top: int = 15) -> str:
        return trace.summary(self.events, top)

    def write(self) -> Path | None:
        if self.path is None:
            return None
        trace.write(self.path, self.events, self.core, f"neuron core {self.core}")
        return self.path


def trace_path(path: str) -> str:
    """A rank's own file under torchrun (RANK set): "{rank}" filled in, or "-rank<N>" added."""
    rank = os.environ.get("RANK")
    if rank is None:
        return path
    if "{rank}" in path:
        return path.replace("{rank}", rank)
    p = Path(path)
    return str(p.with_name(f"{p.stem}-rank{rank}{p.suffix}"))
