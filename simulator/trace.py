"""A profile of the simulated chip: what ran where and when, with the user's source lines.

The profile is a Chrome trace (the JSON format chrome://tracing and ui.perfetto.dev read).
Each launch is one span on its stream's row; the instructions of its executable are spans
on their engine's row (tensor, vector, scalar, gpsimd, dma), at the times the compiler
scheduled them, each named by the ATen ops it computes with the source line that issued
them. Collectives are spans on the collective row. `summary()` turns a trace into a table:
device time by op, by source line and by engine.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trnsim.protos import executable_pb2

LAUNCH = "launch"
INSTRUCTION = "instruction"
COLLECTIVE = "collective"


def _us(ns: int) -> float:
    return ns / 1000.0


def _source(exe: executable_pb2.Executable, node: int, sources: list[str]) -> str:
    """The source line of a node of the compiled graph (sources: per node of the graph
    that was compiled, before the compiler's rewrites dropped any)."""
    origin = exe.node_origin[node] if node < len(exe.node_origin) else node
    return sources[origin] if origin < len(sources) else ""


def launch_events(
    exe: executable_pb2.Executable,
    start_ns: int,
    overhead_ns: int,
    stream: int,
    pid: int,
    name: str,
    sources: list[str],
) -> list[dict[str, Any]]:
    """The trace events of one launch of `exe` that started at start_ns (the launch
    overhead first, then the instructions at their scheduled times); `sources`: the source
    line of each node of the graph that was compiled."""
    ops = [n.op for n in exe.graph.nodes]
    events: list[dict[str, Any]] = [
        {
            "name": name,
            "cat": LAUNCH,
            "ph": "X",
            "ts": _us(start_ns),
            "dur": _us(overhead_ns + exe.modelled_ns),
            "pid": pid,
            "tid": f"stream {stream}",
            "args": {
                "executable": exe.cache_key[:16],
                "ops": len(ops),
                "modelled_ns": exe.modelled_ns,
                "hbm_bytes": exe.hbm_bytes,
                "source": sources[0] if len(sources) == 1 else "",
            },
        }
    ]
    body = start_ns + overhead_ns
    credit = _dma_credit(exe)
    for ins in exe.instructions:
        if not ins.duration_ns:
            continue
        engine = executable_pb2.Engine.Name(ins.engine).lower()
        names = [op.op for op in ins.ops]
        served = credit.get(ins.id)
        if not names and served is not None:  # a DMA: named after the op it serves
            names = [f"{op.op} ({engine})" for op in served.ops]
            ins = _with_nodes(ins, served)
        events.append(
            {
                "name": "+".join(dict.fromkeys(names)) if names else engine,
                "cat": INSTRUCTION,
                "ph": "X",
                "ts": _us(body + ins.start_ns),
                "dur": _us(ins.duration_ns),
                "pid": pid,
                "tid": engine,
                "args": {
                    "source": _source(exe, ins.nodes[0], sources)
                    if ins.nodes
                    else (sources[0] if len(sources) == 1 else ""),
                    "launch": name,
                    "flops": ins.flops,
                    "bytes": ins.bytes,
                },
            }
        )
    return events


def _dma_credit(exe: executable_pb2.Executable) -> dict[int, executable_pb2.Instruction]:
    """For each instruction computing no op (a DMA): the instruction whose data it moves. A
    load serves the first instruction that waits for it; a store, the one that made what it
    writes. Its time is then credited to that op and its source line."""
    by_id = {ins.id: ins for ins in exe.instructions}
    consumers: dict[int, list[executable_pb2.Instruction]] = defaultdict(list)
    for ins in exe.instructions:
        for dep in ins.deps:
            consumers[dep.instruction].append(ins)
    credit: dict[int, executable_pb2.Instruction] = {}
    for ins in exe.instructions:
        if ins.nodes:
            continue
        readers = [c for c in consumers.get(ins.id, []) if c.nodes]
        makers = [p for p in (by_id.get(d.instruction) for d in ins.deps) if p and p.nodes]
        # A store (and a copy) serves what made its data; a load, the first that reads it.
        first, then = (
            (makers, readers) if ins.klass != executable_pb2.DMA_LOAD else (readers, makers)
        )
        if first or then:
            credit[ins.id] = (first or then)[0]
    return credit


def _with_nodes(
    ins: executable_pb2.Instruction, served: executable_pb2.Instruction
) -> executable_pb2.Instruction:
    """The instruction with the nodes of the one it serves (for its source line)."""
    out = executable_pb2.Instruction()
    out.CopyFrom(ins)
    out.nodes.extend(served.nodes)
    return out


def engine_launch_events(
    name: str,
    start_ns: int,
    overhead_ns: int,
    engine_ns: dict[str, int],
    stream: int,
    pid: int,
    source: str,
) -> list[dict[str, Any]]:
    """The trace events of a launch priced by engine (a sparse op: no executable, its
    engines working at once after the launch overhead)."""
    duration = max(engine_ns.values(), default=0)
    events: list[dict[str, Any]] = [
        {
            "name": name,
            "cat": LAUNCH,
            "ph": "X",
            "ts": _us(start_ns),
            "dur": _us(overhead_ns + duration),
            "pid": pid,
            "tid": f"stream {stream}",
            "args": {"ops": 1, "modelled_ns": duration, "source": source},
        }
    ]
    for engine, ns in engine_ns.items():
        if ns:
            events.append(
                {
                    "name": name,
                    "cat": INSTRUCTION,
                    "ph": "X",
                    "ts": _us(start_ns + overhead_ns),
                    "dur": _us(ns),
                    "pid": pid,
                    "tid": engine,
                    "args": {"source": source, "launch": name, "flops": 0, "bytes": 0},
                }
            )
    return events


def collective_event(
    kind: str, start_ns: int, duration_ns: int, nbytes: int, pid: int, source: str
) -> dict[str, Any]:
    return {
        "name": kind,
        "cat": COLLECTIVE,
        "ph": "X",
        "ts": _us(start_ns),
        "dur": _us(duration_ns),
        "pid": pid,
        "tid": "collective",
        "args": {"bytes": nbytes, "source": source},
    }


def write(path: Path, events: list[dict[str, Any]], pid: int, process_name: str) -> None:
    """The trace file (written whole to a temporary name, then renamed)."""
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": process_name}}]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"traceEvents": meta + events, "displayTimeUnit": "ns"}))
    tmp.replace(path)


def read(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
        events = data["traceEvents"] if isinstance(data, dict) else data
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a trnsim profile (a Chrome trace JSON): {e}") from e
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def totals(events: Iterable[dict[str, Any]], cat: str, key: str) -> dict[str, list[float]]:
    """Per value of `key` ("name", "tid" or "source") among events of category `cat`:
    [count, total µs]."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") != cat:
            continue
        k = e.get(key) if key in ("name", "tid") else e.get("args", {}).get(key, "")
        row = out[str(k) or "-"]
        row[0] += 1
        row[1] += float(e.get("dur", 0.0))
    return out


def summary(events: list[dict[str, Any]], top: int = 15) -> str:
    """Device time by op, by source line and by engine; launches and collectives."""
    lines = []
    launches = totals(events, LAUNCH, "tid")
    n_launches = sum(int(r[0]) for r in launches.values())
    span = sum(r[1] for r in launches.values())
    lines.append(f"{n_launches} launches, {span:.1f} us of launches (overhead included)")
    for title, key in (("op", "name"), ("source line", "source")):
        rows = sorted(totals(events, INSTRUCTION, key).items(), key=lambda kv: -kv[1][1])
        total = sum(r[1] for _, r in rows) or 1.0
        lines.append("")
        lines.append(f"{'engine time by ' + title:<64} {'count':>7} {'us':>10} {'share':>6}")
        for name, (count, us) in rows[:top]:
            lines.append(f"{name[-64:]:<64} {int(count):>7} {us:>10.1f} {us / total:>6.1%}")
        if len(rows) > top:
            rest = sum(r[1] for _, r in rows[top:])
            lines.append(f"{f'({len(rows) - top} more)':<64} {'':>7} {rest:>10.1f}")
    lines.append("")
    lines.append(f"{'engine':<12} {'instructions':>12} {'busy us':>10}")
    for engine, (count, us) in sorted(totals(events, INSTRUCTION, "tid").items()):
        lines.append(f"{engine:<12} {int(count):>12} {us:>10.1f}")
    collectives = totals(events, COLLECTIVE, "name")
    if collectives:
        lines.append("")
        for kind, (count, us) in sorted(collectives.items()):
            lines.append(f"collective {kind}: {int(count)} taking {us:.1f} us")
    return "\n".join(lines)
