"""The executor on its own: executables compiled from small graphs, run on CPU tensors, against
the same ATen ops called directly."""

from __future__ import annotations

import pytest
import torch
from trnsim import compiler
from trnsim.compiler.graph import (
    Graph,
    GraphBuilder,
    Node,
    ScalarInput,
    TensorType,
    Value,
    to_proto,
)
from trnsim.protos import executable_pb2, graph_pb2
from trnsim.simulator import execute


def f32(*shape: int) -> TensorType:
    return TensorType.contiguous(list(shape))


def _load(graph, debug: graph_pb2.GraphDebug | None = None) -> execute.LoadedExecutable:  # type: ignore[no-untyped-def]
    options = executable_pb2.CompileOptions(emit_debug_info=debug is not None)
    return execute.load(compiler.compile(to_proto(graph), "trn2", options, debug))


def test_one_op_returns_what_the_op_returns():
    b = GraphBuilder("mm")
    x, w = b.input([8, 16]), b.input([16, 4])
    loaded = _load(b.build(b.op("aten::mm.default", x, w, out=f32(8, 4))))
    a, c = torch.randn(8, 16), torch.randn(16, 4)
    assert loaded.single and loaded.modelled_ns > 0
    (out,) = loaded.run([a, c])
    assert torch.equal(out, torch.mm(a, c))


def test_a_graph_runs_its_ops_in_order_and_returns_its_outputs():
    b = GraphBuilder("mlp")
    x, w, bias = b.input([8, 16]), b.input([16, 4]), b.input([4])
    y = b.op("aten::mm.default", x, w, out=f32(8, 4))
    z = b.op("aten::add.Tensor", y, bias, out=f32(8, 4))
    r = b.op("aten::relu.default", z, out=f32(8, 4))
    loaded = _load(b.build(r, y))
    a, c, d = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
    out, mid = loaded.run([a, c, d])
    assert torch.equal(mid, a @ c) and torch.equal(out, torch.relu(a @ c + d))
    assert set(loaded.engine_ns) and all(ns >= 0 for ns in loaded.engine_ns.values())


def test_outputs_an_out_kernel_can_compute_are_written_into_the_callers_buffer():
    b = GraphBuilder("into")
    x, y = b.input([32]), b.input([32])
    s = b.op("aten::add.Tensor", x, y, out=f32(32))
    e = b.op("aten::exp.default", s, out=f32(32))
    loaded = _load(b.build(e))
    a, c, buffer = torch.randn(32), torch.randn(32), torch.empty(32)
    (out,) = loaded.run([a, c], into=[buffer])
    assert out is buffer and torch.equal(buffer, torch.exp(a + c))


def test_runtime_scalars_are_read_at_each_run():
    node = Node("aten::mul.Scalar", (("", Value(None, 0)), ("", ScalarInput(0))), (f32(4),))
    graph = Graph((f32(4),), (node,), (Value(0, 0),), "scale", num_scalar_inputs=1)
    graph.validate()
    loaded = _load(graph)
    a = torch.arange(4.0)
    assert torch.equal(loaded.run([a], [2.0])[0], a * 2)
    assert torch.equal(loaded.run([a], [0.5])[0], a * 0.5)


def test_random_ops_draw_from_the_generator_given():
    b = GraphBuilder("drop")
    x = b.input([64])
    loaded = _load(b.build(b.op("aten::bernoulli.p", x, 0.5, out=f32(64))))
    a = torch.ones(64)
    runs = [loaded.run([a], [], torch.Generator().manual_seed(7))[0] for _ in range(2)]
    expected = torch.bernoulli(a, 0.5, generator=torch.Generator().manual_seed(7))
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], expected)


def test_a_failing_op_is_an_execution_error_naming_it_and_its_source_line():
    b = GraphBuilder("bad")
    x, w = b.input([8, 16]), b.input([16, 4])
    debug = graph_pb2.GraphDebug(
        node_locations=[graph_pb2.SourceLocation(file="train.py", line=42, function="step")]
    )
    loaded = _load(b.build(b.op("aten::mm.default", x, w, out=f32(8, 4))), debug)
    with pytest.raises(execute.ExecutionError, match=r"aten::mm.default .*train.py:42") as info:
        loaded.run([torch.randn(8, 16), torch.randn(15, 4)])  # (not the shapes compiled for)
    assert info.value.op == "aten::mm.default" and isinstance(info.value.cause, RuntimeError)


def test_resolve_op_and_transfer():
    assert execute.resolve_op("aten::add.Tensor") is torch.ops.aten.add.Tensor
    assert execute.resolve_op("aten::relu") is torch.ops.aten.relu.default
    dst, src = torch.empty(3), torch.tensor([1.0, 2.0, 3.0])
    assert execute.transfer(dst, src) is dst and torch.equal(dst, src)


def test_the_first_vector_math_call_of_a_process_is_exact():
    """MKL's first VML call in a multi-threaded process can be off in the 4th digit (about 1 in
    10 fresh processes here); importing torch, which loads the device, absorbs it. Three fresh
    processes, each checking its first sqrt (the CPU's, as a user's would be)."""
    import subprocess
    import sys

    check = (
        "import torch\n"
        "g = torch.Generator().manual_seed(0)\n"
        "xs = [torch.randn(64, 64, generator=g) for _ in range(29)]\n"
        "s = torch.sqrt(xs[0])\n"
        "print((s.double() ** 2 - xs[0].double()).abs().nan_to_num().max().item())\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", check], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    errors = [float(p.communicate(timeout=120)[0]) for p in procs]
    assert max(errors) < 1e-6, errors
