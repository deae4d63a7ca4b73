"""Memory planning: reuse, lifetimes, budgets."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trnsim.compiler import CompileError, compile
from trnsim.compiler.graph import Alias, GraphBuilder, TensorType, Value
from trnsim.compiler.memory_plan import memory_plan
from trnsim.protos import executable_pb2 as ex

from .helpers import chain, f32, mlp

BIG = 1 << 40


def test_reuse_brings_peak_below_the_sum_of_buffers():
    plan = memory_plan(chain(10), [0] * 10, BIG, BIG)
    internal = [b for b in plan.buffers if b.role == ex.INTERNAL]
    assert len(internal) == 9
    assert plan.hbm_unshared_bytes == 9 * 4096 * 4
    assert plan.hbm_scratch_bytes == 2 * 4096 * 4, "a chain needs only two live intermediates"


def test_roles_and_aliases():
    plan = memory_plan(mlp(), [0] * 6, BIG, BIG)
    roles = [ex.BufferRole.Name(b.role) for b in plan.buffers]
    assert roles == [
        "INPUT",
        "INPUT",
        "INPUT",
        "ALIAS",
        "INTERNAL",
        "INTERNAL",
        "ALIAS",
        "INTERNAL",
        "OUTPUT",
    ]
    view = plan.buffers[plan.buffer_of[Value(0, 0)]]
    assert plan.root(view.id).role == ex.INPUT


def test_an_observable_view_keeps_its_base_as_an_output():
    b = GraphBuilder()
    x = b.input([4, 4])
    e = b.op("aten::exp.default", x, out=f32(4, 4))
    v = b.op("aten::view.default", e, (16,), out=f32(16), aliases=[Alias(0, 0)])
    plan = memory_plan(b.build(v), [0, 0], BIG, BIG)
    assert plan.buffers[plan.buffer_of[Value(0, 0)]].role == ex.OUTPUT


def test_hbm_budget_is_enforced():
    with pytest.raises(CompileError, match="over the budget"):
        compile(chain(4, size=1 << 20), "trn2", ex.CompileOptions(hbm_budget_bytes=1 << 20))


def test_sbuf_budget_is_enforced():
    with pytest.raises(CompileError, match="SBUF"):
        compile(chain(2), "trn2", ex.CompileOptions(sbuf_budget_bytes=1024))


@st.composite
def random_graphs(draw):
    """Random DAGs of unary/binary ops with occasional views and in-place writes."""
    b = GraphBuilder()
    values = [b.input([draw(st.integers(1, 64))]) for _ in range(draw(st.integers(1, 3)))]
    sizes = {v: b._inputs[v.index].shape[0] for v in values}
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["unary", "binary", "view", "inplace"]))
        a = draw(st.sampled_from(values))
        n = sizes[a]
        if kind == "unary":
            v = b.op("aten::exp.default", a, out=f32(n))
        elif kind == "binary":
            same = [x for x in values if sizes[x] == n]
            v = b.op("aten::add.Tensor", a, draw(st.sampled_from(same)), out=f32(n))
        elif kind == "view":
            v = b.op("aten::alias.default", a, out=f32(n), aliases=[Alias(0, 0)])
        else:
            v = b.op("aten::mul_.Scalar", a, 2.0, out=f32(n), aliases=[Alias(0, 0, writes=True)])
        values.append(v)
        sizes[v] = n
    outs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3, unique=True))
    return b.build(*outs)


@settings(max_examples=80, deadline=None)
@given(random_graphs())
def test_no_two_live_buffers_overlap(g):
    plan = memory_plan(g, [0] * len(g.nodes), BIG, BIG)
    internal = [b for b in plan.buffers if b.role == ex.INTERNAL]
    for i, x in enumerate(internal):
        for y in internal[i + 1 :]:
            lives_overlap = x.live_from <= y.live_until and y.live_from <= x.live_until
            addresses_overlap = x.offset < y.offset + y.size and y.offset < x.offset + x.size
            assert not (lives_overlap and addresses_overlap), (x, y)
    assert plan.hbm_scratch_bytes <= plan.hbm_unshared_bytes
    # Every read of a value happens while its owning buffer is live.
    for i, node in enumerate(g.nodes):
        for v in node.tensor_args():
            root = plan.root(plan.buffer_of[v])
            assert root.live_from <= i <= root.live_until


@settings(max_examples=40, deadline=None)
@given(random_graphs())
def test_random_graphs_compile_with_a_consistent_schedule(g):
    exe = compile(g, "trn2")
    check_schedule(exe)


def check_schedule(exe: ex.Executable) -> None:
    """Dependencies are respected and every engine runs one instruction at a time."""
    instrs = {i.id: i for i in exe.instructions}
    for ins in exe.instructions:
        for dep in ins.deps:
            p = instrs[dep.instruction]
            if dep.streamed:
                assert ins.start_ns >= p.start_ns
                assert ins.start_ns + ins.duration_ns + 1 >= p.start_ns + p.duration_ns
            else:
                assert ins.start_ns + 1 >= p.start_ns + p.duration_ns, (p, ins)
    for program in exe.engines:
        if program.engine in (ex.NONE, ex.DMA):
            continue
        spans = [
            (instrs[i].start_ns, instrs[i].start_ns + instrs[i].duration_ns)
            for i in program.instructions
        ]
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start + 1 >= end, (
                f"{ex.Engine.Name(program.engine)} runs two instructions at once"
            )
    assert exe.modelled_ns >= max((i.start_ns + i.duration_ns for i in exe.instructions), default=0)


def test_typed_view_buffers_have_types():
    exe = compile(mlp(), "trn2")
    for b in exe.memory_plan.buffers:
        assert TensorType(tuple(b.type.shape), tuple(b.type.strides), b.type.dtype).numel >= 0
