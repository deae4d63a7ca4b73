"""Lowering stays linear in the graph: memory-reuse dependencies are bounded per instruction,
and dropping the ones others imply leaves the schedule exactly as the exhaustive rule's."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trnsim.compiler import PASSES, Compilation, run_passes
from trnsim.compiler.graph import Graph, GraphBuilder, from_proto
from trnsim.compiler.intervals import AddressMap, Lifetimes
from trnsim.compiler.lower import Builder, Instr, build, lower
from trnsim.compiler.memory_plan import MemoryPlan
from trnsim.compiler.schedule import list_schedule
from trnsim.protos import executable_pb2 as ex
from trnsim.protos import graph_pb2
from trnsim.simulator.config import get_target

from .helpers import f32, mlp
from .test_memory_plan import random_graphs

FIXTURES = Path(__file__).with_name("fixtures")
GPT = [from_proto(graph_pb2.Graph.FromString(p.read_bytes())) for p in FIXTURES.glob("gpt_*.pb")]
UNFUSED = ex.CompileOptions(disable_fusion=True)


def relu_chain(n: int, size: int = 4096) -> Graph:
    """Every intermediate dies at its one use: the memory plan reuses the same few regions
    over and over, each of which the exhaustive rule tied to every earlier use."""
    b = GraphBuilder("relu_chain")
    v = b.input([size])
    for _ in range(n):
        v = b.op("aten::relu.default", v, out=f32(size))
    return b.build(v)


def dependencies(g: Graph, options: ex.CompileOptions) -> int:
    """Dependencies after lowering (the passes up to it: no schedule, no emit)."""
    c = Compilation(g, get_target("trn2"), options)
    for name, run in PASSES:
        run(c)
        if name == "lower":
            return sum(len(i.deps) for i in c.instructions)
    raise AssertionError("no lowering pass")


@pytest.mark.parametrize("options", [ex.CompileOptions(), UNFUSED], ids=["fused", "unfused"])
def test_dependencies_grow_linearly_with_the_graph(options: ex.CompileOptions) -> None:
    small, large = 300, 1200
    per_node_small = dependencies(relu_chain(small), options) / small
    per_node_large = dependencies(relu_chain(large), options) / large
    # The exhaustive rule gave ~n/2 per node here (about 600 at 1,200 nodes): quadratic.
    assert per_node_large <= 8, per_node_large
    assert per_node_large <= per_node_small * 1.1 + 0.1, (per_node_small, per_node_large)


def exhaustive_reuse_deps(b: Builder, plan: MemoryPlan) -> None:
    """The rule as first written: every write into a buffer waits for every earlier read and
    write of every buffer that lived in its addresses before (quadratic in the graph)."""
    internal = [x for x in plan.buffers if x.role == ex.INTERNAL and x.size]
    writers: dict[int, list[int]] = {}
    accesses: dict[int, list[int]] = {}
    for ins in b.instrs:
        for w in ins.writes:
            writers.setdefault(plan.root(w).id, []).append(ins.id)
        for x in [*ins.reads, *ins.writes]:
            accesses.setdefault(plan.root(x).id, []).append(ins.id)
    for new in internal:
        for old in internal:
            if old.live_until >= new.live_from or old is new:
                continue
            if old.offset < new.offset + new.size and new.offset < old.offset + old.size:
                for w in writers.get(new.id, []):
                    for r in accesses.get(old.id, []):
                        if r < w and r not in b.instrs[w].deps:
                            b.instrs[w].deps[r] = False


def schedules_match(g: Graph, options: ex.CompileOptions) -> tuple[int, int]:
    """Lowers g both ways and checks the schedules are identical; returns both dep counts."""
    c = run_passes(g, "trn2", options)
    assert c.plan is not None
    mine = lower(c.graph, c.kernels, c.plan, c.target, c.groups)
    b = build(c.graph, c.kernels, c.plan, c.target, c.groups)
    exhaustive_reuse_deps(b, c.plan)
    full: list[Instr] = b.instrs
    assert list_schedule(mine, c.target) == list_schedule(full, c.target)
    assert [(i.start_ns, i.end_ns) for i in mine] == [(i.start_ns, i.end_ns) for i in full]
    for a, e in zip(mine, full, strict=True):
        assert set(a.deps) <= set(e.deps) and all(e.deps[p] == s for p, s in a.deps.items())
    return sum(len(i.deps) for i in mine), sum(len(i.deps) for i in full)


@pytest.mark.parametrize("options", [ex.CompileOptions(), UNFUSED], ids=["fused", "unfused"])
def test_fewer_dependencies_same_schedule_on_real_graphs(options: ex.CompileOptions) -> None:
    kept = total = 0
    for g in [*GPT, mlp(), relu_chain(200)]:
        a, e = schedules_match(copy.deepcopy(g), options)
        kept, total = kept + a, total + e
    assert kept < total


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_fewer_dependencies_same_schedule_on_random_graphs(g: Graph) -> None:
    schedules_match(g, ex.CompileOptions())
    schedules_match(g, UNFUSED)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 80), st.integers(0, 40)), max_size=40),
    st.tuples(st.integers(0, 80), st.integers(0, 40)),
)
def test_lifetimes_finds_what_a_scan_finds(
    items: list[tuple[int, int]], query: tuple[int, int]
) -> None:
    index: Lifetimes[int] = Lifetimes(0, 120)
    for k, (first, length) in enumerate(items):
        index.add(k, first, first + length)
    first, last = query[0], query[0] + query[1]
    found = list(index.overlapping(first, last))
    expected = [k for k, (f, n) in enumerate(items) if f <= last and first <= f + n]
    assert sorted(found) == expected


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20)), max_size=30),
    st.tuples(st.integers(0, 60), st.integers(1, 20)),
)
def test_address_map_shows_the_last_painter_of_each_byte(
    paints: list[tuple[int, int]], query: tuple[int, int]
) -> None:
    memory = AddressMap()
    last: dict[int, int] = {}
    for k, (start, size) in enumerate(paints):
        memory.paint(start, start + size, k)
        last.update({byte: k for byte in range(start, start + size)})
    start, end = query[0], query[0] + query[1]
    expected = {last[byte] for byte in range(start, end) if byte in last}
    assert set(memory.occupants(start, end)) == expected
    assert memory.starts == sorted(memory.starts)
    assert all(e <= s for e, s in zip(memory.ends, memory.starts[1:], strict=False))
