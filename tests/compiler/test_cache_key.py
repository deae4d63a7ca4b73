"""Cache keys: stable for the same compile, different for any change that matters."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import trnsim.compiler.keys as ck
from trnsim.compiler import cache_key
from trnsim.compiler.graph import GraphBuilder, from_proto, to_proto
from trnsim.protos import executable_pb2 as ex
from trnsim.protos import graph_pb2
from trnsim.simulator.config import TRN1, TRN2

from .helpers import f32, mlp


def test_stable_for_the_same_graph_built_twice():
    assert cache_key(mlp(), TRN2).digest == cache_key(mlp(), TRN2).digest


def test_stable_through_a_proto_round_trip():
    g = mlp()
    back = from_proto(graph_pb2.Graph.FromString(to_proto(g).SerializeToString()))
    assert cache_key(back, TRN2) == cache_key(g, TRN2)


def test_stable_across_processes():
    """Another interpreter (other hash seed) computes the same key."""
    code = (
        "from tests.compiler.helpers import mlp\n"
        "from trnsim.compiler import cache_key\n"
        "from trnsim.simulator.config import TRN2\n"
        "print(cache_key(mlp(), TRN2).digest)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    ).stdout.strip()
    assert out == cache_key(mlp(), TRN2).digest


def test_components_are_named_and_ordered():
    key = cache_key(mlp(), TRN2)
    assert [name for name, _ in key.components] == [
        "graph",
        "compiler_version",
        "format_version",
        "target",
        "options",
    ]


def test_debug_only_options_do_not_change_the_key():
    base = cache_key(mlp(), TRN2, ex.CompileOptions())
    debug = ex.CompileOptions(emit_debug_info=True, debug_sleep_ms=50, debug_crash_worker=True)
    assert cache_key(mlp(), TRN2, debug) == base


def _changed_graphs():
    g = mlp()
    yield "shape", mlp(batch=32)
    yield (
        "op",
        replace(
            g, nodes=(*g.nodes[:2], replace(g.nodes[2], op="aten::gelu.default"), *g.nodes[3:])
        ),
    )
    dtype_inputs = (replace(g.inputs[0], dtype=graph_pb2.BFLOAT16), *g.inputs[1:])
    yield "dtype", replace(g, inputs=dtype_inputs)
    b = GraphBuilder()
    x = b.input([8])
    yield "scalar 1.0", b.build(b.op("aten::mul.Scalar", x, 1.0, out=f32(8)))
    b = GraphBuilder()
    x = b.input([8])
    yield "scalar 2.0", b.build(b.op("aten::mul.Scalar", x, 2.0, out=f32(8)))
    b = GraphBuilder()
    x = b.input([8])
    yield "int 2 vs float 2.0", b.build(b.op("aten::mul.Scalar", x, 2, out=f32(8)))
    yield "strides", replace(g, inputs=(replace(g.inputs[0], strides=(1, 64)), *g.inputs[1:]))


def test_sensitive_to_every_graph_change():
    keys = {name: cache_key(graph, TRN2).digest for name, graph in _changed_graphs()}
    keys["original"] = cache_key(mlp(), TRN2).digest
    assert len(set(keys.values())) == len(keys), keys


def test_sensitive_to_target_options_and_versions(monkeypatch):
    base = cache_key(mlp(), TRN2)
    assert cache_key(mlp(), TRN1).explain(base) == ["target"]
    other = cache_key(mlp(), TRN2, ex.CompileOptions(disable_cse=True))
    assert other.explain(base) == ["options"]
    monkeypatch.setattr(ck, "compiler_version", lambda: "9.9.9+other")
    ck._fixed_components.cache_clear()
    assert cache_key(mlp(), TRN2).explain(base) == ["compiler_version"]
    monkeypatch.undo()
    monkeypatch.setattr(ck, "FORMAT_VERSION", 999)
    ck._fixed_components.cache_clear()
    assert cache_key(mlp(), TRN2).explain(base) == ["format_version"]
    monkeypatch.undo()
    ck._fixed_components.cache_clear()


def test_components_are_logged_at_debug(caplog):
    with caplog.at_level("DEBUG", logger="trnsim.compiler.keys"):
        key = cache_key(mlp(), TRN2)
    text = caplog.text
    for name, digest in key.components:
        assert f"{name} = {digest}" in text


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1]])
def test_input_declaration_order_does_not_matter(order):
    """Graphs that differ only in how inputs were numbered get one key."""
    b = GraphBuilder()
    ins = [b.input([4]) for _ in range(3)]
    x, y, z = (ins[i] for i in order)
    s = b.op("aten::add.Tensor", x, y, out=f32(4))
    g = b.build(b.op("aten::mul.Tensor", s, z, out=f32(4)))
    b0 = GraphBuilder()
    x0, y0, z0 = (b0.input([4]) for _ in range(3))
    s0 = b0.op("aten::add.Tensor", x0, y0, out=f32(4))
    g0 = b0.build(b0.op("aten::mul.Tensor", s0, z0, out=f32(4)))
    assert cache_key(g, TRN2) == cache_key(g0, TRN2)
