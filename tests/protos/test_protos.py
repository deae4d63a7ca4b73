"""Proto round trips and freshness of the generated modules."""

from __future__ import annotations

from pathlib import Path

import pytest
from trnsim.compiler import compile
from trnsim.compiler.graph import (
    Alias,
    DeviceArg,
    DTypeArg,
    GraphBuilder,
    LayoutArg,
    MemoryFormatArg,
    TensorType,
    from_proto,
    to_proto,
)
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import executable_pb2, graph_pb2

REPO = Path(__file__).resolve().parents[2]


def every_argument_kind_graph():
    b = GraphBuilder()
    x = b.input([4, 8])
    idx = b.input([3], "int64")
    t = TensorType.contiguous([4, 8])
    v = b.op("aten::view.default", x, (4, 8), out=t, aliases=[Alias(0, 0)])
    y = b.op(
        "aten::_to_copy.default",
        v,
        None,
        DTypeArg(graph_pb2.BFLOAT16),
        LayoutArg(graph_pb2.STRIDED),
        DeviceArg("neuron"),
        False,
        MemoryFormatArg(graph_pb2.PRESERVE_FORMAT),
        names=["self", "", "dtype", "layout", "device", "pin_memory", "memory_format"],
        out=TensorType.contiguous([4, 8], "bfloat16"),
    )
    z_type = TensorType.contiguous([3, 8], "bfloat16")
    z = b.op("aten::index.Tensor", y, (idx, None), out=z_type)
    w = b.op("aten::mul.Scalar", z, 0.5, out=z_type)
    s = b.op("aten::add_.Tensor", x, x, 1, out=t, aliases=[Alias(0, 0, writes=True)])
    g = b.op("aten::gelu.default", w, "tanh", names=["", "approximate"], out=z_type)
    return b.build(g, s)


def test_graph_round_trip_through_bytes():
    g = every_argument_kind_graph()
    data = to_proto(g).SerializeToString(deterministic=True)
    back = from_proto(graph_pb2.Graph.FromString(data))
    assert back == g
    assert to_proto(back).SerializeToString(deterministic=True) == data


def test_executable_round_trip():
    exe = compile(every_argument_kind_graph(), "trn1")
    data = exe.SerializeToString(deterministic=True)
    back = executable_pb2.Executable.FromString(data)
    assert back == exe
    assert back.format_version == exe.format_version > 0
    assert back.target == "trn1"


def test_service_messages_round_trip():
    g = to_proto(every_argument_kind_graph())
    req = svc.CompileRequest(id=7, priority=svc.BACKGROUND, graph=g, target="trn2")
    req.debug.node_locations.add(file="train.py", line=12, function="step", code="y = f(x)")
    assert svc.CompileRequest.FromString(req.SerializeToString()) == req
    blob = svc.ExecutableBlob(data=b"abc", sha256=b"\x00" * 32, format_version=1)
    res = svc.CompileResult(id=7, cache_key="k", executable=blob, tier=svc.DISK)
    back = svc.CompileResult.FromString(res.SerializeToString())
    assert back.WhichOneof("outcome") == "executable" and back.executable.data == b"abc"
    stats = svc.StatsResponse(requests=3, failures={"TRANSIENT": 1})
    assert svc.StatsResponse.FromString(stats.SerializeToString()).failures["TRANSIENT"] == 1


def test_service_defines_the_six_rpcs():
    methods = {m.name for m in svc.DESCRIPTOR.services_by_name["CompileService"].methods}
    assert methods == {"Compile", "Lookup", "Touch", "Stats", "GetInfo", "Nearest"}
    compile_rpc = svc.DESCRIPTOR.services_by_name["CompileService"].methods_by_name["Compile"]
    assert compile_rpc.client_streaming and compile_rpc.server_streaming


def test_generated_code_is_fresh(tmp_path):
    """The generated modules match what protoc makes of the .proto files right now."""
    pytest.importorskip("grpc_tools")
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate", REPO / "protos" / "generate.py")
    assert spec and spec.loader
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    fresh = generate.generate(tmp_path)
    assert fresh, "the generator wrote nothing"
    stale = [
        p.name
        for p in fresh
        if not (REPO / "protos" / p.name).exists()
        or (REPO / "protos" / p.name).read_bytes() != p.read_bytes()
    ]
    assert not stale, f"stale generated code {stale}: run `make protos` (or reinstall)"
