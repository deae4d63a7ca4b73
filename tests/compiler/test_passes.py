"""Dead code elimination and common subexpression elimination."""

from __future__ import annotations

from trnsim.compiler.graph import Alias, GraphBuilder, Value
from trnsim.compiler.passes import eliminate_common_subexpressions, eliminate_dead_code

from .helpers import f32, mlp


def test_dce_drops_unused_nodes_and_renumbers():
    b = GraphBuilder()
    x = b.input([8])
    b.op("aten::exp.default", x, out=f32(8))  # unused
    y = b.op("aten::neg.default", x, out=f32(8))
    g = eliminate_dead_code(b.build(y))
    assert [n.op for n in g.nodes] == ["aten::neg.default"]
    assert g.outputs == (Value(0, 0),)
    g.validate()


def test_the_rewrites_say_where_each_node_came_from():
    """Each kept node's index in the graph compiled (profiles name its source line by it),
    through both passes, and in the executable."""
    from trnsim import compiler

    b = GraphBuilder()
    x = b.input([8])
    b.op("aten::exp.default", x, out=f32(8))  # 0: unused
    a = b.op("aten::neg.default", x, out=f32(8))  # 1
    a2 = b.op("aten::neg.default", x, out=f32(8))  # 2: the same as 1
    s = b.op("aten::add.Tensor", a, a2, out=f32(8))  # 3
    g = eliminate_common_subexpressions(eliminate_dead_code(b.build(s)))
    assert [n.op for n in g.nodes] == ["aten::neg.default", "aten::add.Tensor"]
    assert g.origin == (1, 3)
    exe = compiler.compile(b.build(s))
    assert list(exe.node_origin) == [1, 3]


def test_dce_keeps_writes_and_random_ops():
    b = GraphBuilder()
    x = b.input([8])
    b.op("aten::add_.Tensor", x, x, out=f32(8), aliases=[Alias(0, 0, writes=True)])
    b.op("aten::rand.default", (8,), out=f32(8))  # advances the RNG even if unused
    b.op("aten::exp.default", x, out=f32(8))
    g = eliminate_dead_code(b.build())
    assert [n.op for n in g.nodes] == ["aten::add_.Tensor", "aten::rand.default"]


def test_dce_keeps_what_outputs_need():
    assert eliminate_dead_code(mlp()) == mlp()


def test_cse_merges_identical_nodes():
    b = GraphBuilder()
    x = b.input([8])
    a = b.op("aten::exp.default", x, out=f32(8))
    a2 = b.op("aten::exp.default", x, out=f32(8))
    s = b.op("aten::add.Tensor", a, a2, out=f32(8))
    g = eliminate_common_subexpressions(b.build(s, a2))
    assert [n.op for n in g.nodes] == ["aten::exp.default", "aten::add.Tensor"]
    assert g.nodes[1].args[0][1] == g.nodes[1].args[1][1] == Value(0, 0)
    assert g.outputs == (Value(1, 0), Value(0, 0))


def test_cse_keeps_different_arguments_apart():
    b = GraphBuilder()
    x = b.input([8])
    a = b.op("aten::mul.Scalar", x, 2.0, out=f32(8))
    c = b.op("aten::mul.Scalar", x, 3.0, out=f32(8))
    g = eliminate_common_subexpressions(b.build(a, c))
    assert len(g.nodes) == 2


def test_cse_never_merges_random_ops_or_across_writes():
    b = GraphBuilder()
    x = b.input([8])
    r1 = b.op("aten::rand.default", (8,), out=f32(8))
    r2 = b.op("aten::rand.default", (8,), out=f32(8))
    e1 = b.op("aten::exp.default", x, out=f32(8))
    b.op("aten::mul_.Scalar", x, 2.0, out=f32(8), aliases=[Alias(0, 0, writes=True)])
    e2 = b.op("aten::exp.default", x, out=f32(8))  # x changed in between: not the same value
    g = eliminate_common_subexpressions(b.build(r1, r2, e1, e2))
    assert len(g.nodes) == 5


def test_cse_keeps_apart_values_that_are_written_later():
    b = GraphBuilder()
    x = b.input([8])
    z1 = b.op("aten::zeros_like.default", x, out=f32(8))
    z2 = b.op("aten::zeros_like.default", x, out=f32(8))
    v = b.op("aten::view.default", z1, (8,), out=f32(8), aliases=[Alias(0, 0)])
    b.op("aten::add_.Tensor", v, x, out=f32(8), aliases=[Alias(0, 0, writes=True)])
    g = eliminate_common_subexpressions(b.build(z1, z2))
    assert [n.op for n in g.nodes].count("aten::zeros_like.default") == 2


def test_a_fill_is_a_broadcast_constant_only_while_nothing_else_needs_its_buffer():
    from trnsim.compiler.passes import broadcast_constants

    def fill_then(reader: str, output: bool = False) -> frozenset[int]:
        b = GraphBuilder()
        x, w = b.input([8]), b.input([8])
        f = b.op("aten::fill_.Scalar", w, 0.5, out=f32(8), aliases=[Alias(0, 0, writes=True)])
        y = b.op(reader, x, f, out=f32(8))
        return broadcast_constants(b.build(y, *([f] if output else [])))

    assert broadcast_constants(mlp()) == frozenset()
    assert fill_then("aten::mul.Tensor") == {0}, "read by an elementwise op: folded"
    assert fill_then("aten::mv.default") == frozenset(), "a matmul reads it from memory"
    assert fill_then("aten::mul.Tensor", output=True) == frozenset(), "the caller sees it"
