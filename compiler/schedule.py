"""List scheduling of instructions on the core's engines (critical path first)."""

from __future__ import annotations

import heapq
from collections import defaultdict

from trnsim.compiler.lower import Instr
from trnsim.simulator.config import Target


def _occupancy(ins: Instr, target: Target) -> float:
    """How long the instruction holds its engine. A DMA transfer's fixed latency overlaps
    with other transfers (16 queues), so it holds the DMA bandwidth only while moving bytes."""
    if ins.engine == "dma":
        return max(0.0, ins.cost.ns - target.dma_fixed_ns)
    return ins.cost.ns


def bottom_levels(instrs: list[Instr]) -> list[float]:
    """Longest path from each instruction to the end of the program (its own time included)."""
    consumers: dict[int, list[int]] = defaultdict(list)
    for ins in instrs:
        for p in ins.deps:
            consumers[p].append(ins.id)
    level = [0.0] * len(instrs)
    for ins in reversed(instrs):  # ids are a topological order: deps point backwards
        level[ins.id] = ins.cost.ns + max((level[c] for c in consumers[ins.id]), default=0.0)
    return level


def list_schedule(instrs: list[Instr], target: Target) -> float:
    """Sets start/end of every instruction; returns the makespan in ns.

    Engines are in-order queues: an instruction starts when its engine is free and its
    dependencies allow (a streamed dependency after the producer's first tile).
    """
    level = bottom_levels(instrs)
    waiting = {ins.id: len(ins.deps) for ins in instrs}
    consumers: dict[int, list[int]] = defaultdict(list)
    for ins in instrs:
        for p in ins.deps:
            consumers[p].append(ins.id)
    ready = [(-level[i.id], i.id) for i in instrs if not i.deps]
    heapq.heapify(ready)
    engine_free: dict[str, float] = defaultdict(float)
    makespan = 0.0
    while ready:
        _, iid = heapq.heappop(ready)
        ins = instrs[iid]
        start, end_floor = 0.0, 0.0
        for p, streamed in ins.deps.items():
            producer = instrs[p]
            if streamed:
                start = max(start, producer.start_ns + producer.cost.first_tile_ns)
                end_floor = max(end_floor, producer.end_ns + ins.cost.first_tile_ns)
            else:
                start = max(start, producer.end_ns)
        if ins.engine != "none":
            start = max(start, engine_free[ins.engine])
        ins.start_ns = start
        ins.end_ns = max(start + ins.cost.ns, end_floor)
        if ins.engine != "none":
            engine_free[ins.engine] = ins.end_ns - (ins.cost.ns - _occupancy(ins, target))
        makespan = max(makespan, ins.end_ns)
        for c in consumers[iid]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (-level[c], c))
    unscheduled = [i for i, n in waiting.items() if n]
    assert not unscheduled, f"dependency cycle among instructions {unscheduled[:5]}"
    return makespan
