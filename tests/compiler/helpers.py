"""Graphs the compiler tests share."""

from __future__ import annotations

from trnsim.compiler.graph import Alias, Graph, GraphBuilder, TensorType


def f32(*shape: int) -> TensorType:
    return TensorType.contiguous(shape, "float32")


def mlp(batch: int = 64, width: int = 256, hidden: int = 1024) -> Graph:
    b = GraphBuilder("mlp")
    x = b.input([batch, width])
    w1 = b.input([hidden, width])
    w2 = b.input([width, hidden])
    w1t = b.op(
        "aten::t.default",
        w1,
        out=TensorType((width, hidden), (1, width), 1),
        aliases=[Alias(0, 0)],
    )
    h = b.op("aten::mm.default", x, w1t, out=f32(batch, hidden))
    a = b.op("aten::relu.default", h, out=f32(batch, hidden))
    w2t = b.op(
        "aten::t.default",
        w2,
        out=TensorType((hidden, width), (1, hidden), 1),
        aliases=[Alias(0, 0)],
    )
    y = b.op("aten::mm.default", a, w2t, out=f32(batch, width))
    r = b.op("aten::add.Tensor", y, x, out=f32(batch, width))
    return b.build(r)


def chain(n: int, size: int = 4096) -> Graph:
    """x -> exp -> exp -> ... n times: every intermediate dies right after its one use."""
    b = GraphBuilder("chain")
    v = b.input([size])
    for _ in range(n):
        v = b.op("aten::exp.default", v, out=f32(size))
    return b.build(v)
