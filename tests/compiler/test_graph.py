"""The graph IR: validation, canonical form, the JSON form of hand-written graphs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trnsim.compiler.graph import (
    Graph,
    GraphBuilder,
    GraphError,
    Node,
    TensorType,
    Value,
    canonical_bytes,
    canonicalize,
    load_json,
)

from .helpers import f32, mlp

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graphs"


def test_tensor_type_sizes():
    t = TensorType.contiguous([2, 3, 4], "bfloat16")
    assert t.strides == (12, 4, 1) and t.numel == 24 and t.nbytes == 48
    view = TensorType((3, 2), (1, 3), t.dtype)
    assert view.nbytes == 12 and not view.is_contiguous()
    assert TensorType.contiguous([0, 5]).nbytes == 0


def test_validate_rejects_forward_and_dangling_references():
    bad = Graph((f32(4),), (Node("aten::neg.default", (("", Value(0, 0)),), (f32(4),)),), ())
    with pytest.raises(GraphError, match="node 0"):
        bad.validate()
    with pytest.raises(GraphError, match="graph outputs"):
        Graph((f32(4),), (), (Value(None, 3),)).validate()


def test_canonicalize_numbers_inputs_by_first_use():
    b = GraphBuilder()
    a = b.input([4])
    c = b.input([4])
    y = b.op("aten::mul.Tensor", c, a, out=f32(4))
    g = b.build(y)
    canonical, order = canonicalize(g)
    assert order == [1, 0]
    assert canonical.nodes[0].args[0][1] == Value(None, 0)
    # The same program written with inputs declared in use order has the same bytes.
    b2 = GraphBuilder()
    c2 = b2.input([4])
    a2 = b2.input([4])
    g2 = b2.build(b2.op("aten::mul.Tensor", c2, a2, out=f32(4)))
    assert canonical_bytes(g) == canonical_bytes(g2)


def test_users():
    g = mlp()
    users = g.users()
    assert users[Value(None, 0)] == [1, 5]  # x feeds the first mm and the residual add


def test_load_json_example():
    g = load_json(EXAMPLES / "mlp.json")
    assert g.name == "mlp-block" and len(g.nodes) == 9 and len(g.outputs) == 2
    assert g.nodes[0].aliases and g.nodes[2].arg("approximate") == "tanh"


def test_load_json_errors(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"inputs": {}, "nodes": [], "outputs": ["%nothing"]}))
    with pytest.raises(GraphError, match="before it is defined"):
        load_json(path)
