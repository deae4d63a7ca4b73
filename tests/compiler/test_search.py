"""-O levels: the schedule search never makes a schedule worse, beats -O1 on the GPT
example's fused graphs, changes no numerics, and costs modelled compile time that grows
with the graph and the level."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trnsim.compiler import CompileError, cache_key, compile, run_passes
from trnsim.compiler.__main__ import main as explain_main
from trnsim.compiler.graph import GraphBuilder, from_proto
from trnsim.protos import executable_pb2 as ex
from trnsim.protos import graph_pb2
from trnsim.simulator import execute
from trnsim.simulator.config import get_target

from .helpers import chain, f32, mlp

FIXTURES = Path(__file__).with_name("fixtures")
GPT = [graph_pb2.Graph.FromString(p.read_bytes()) for p in sorted(FIXTURES.glob("gpt_fused_*.pb"))]


def _exe(graph, level: int) -> ex.Executable:  # type: ignore[no-untyped-def]
    return compile(graph, "trn2", ex.CompileOptions(opt_level=level))


@pytest.mark.parametrize("name", ["mlp", "chain", "gpt0", "gpt1"])
def test_a_higher_level_is_never_slower(name):
    graph = {"mlp": mlp(), "chain": chain(12), "gpt0": GPT[0], "gpt1": GPT[1]}[name]
    o1, o2, o3 = (_exe(graph, level) for level in (1, 2, 3))
    assert o3.modelled_ns <= o2.modelled_ns <= o1.modelled_ns
    assert o2.o1_modelled_ns == o3.o1_modelled_ns == o1.modelled_ns
    assert o1.search_schedules == 0 < o2.search_schedules < o3.search_schedules


def test_o2_beats_o1_by_a_tenth_on_the_gpt_fused_graphs():
    o1 = sum(_exe(g, 1).modelled_ns for g in GPT)
    o2 = sum(_exe(g, 2).modelled_ns for g in GPT)
    assert len(GPT) == 2 and o2 <= 0.9 * o1, (o1, o2)


def test_the_search_changes_no_numerics():
    """Cuts, layouts and engines are how the chip runs the graph, not what it computes: the
    executor gives the same bits at every level."""
    graph = GPT[1]
    g = from_proto(graph)
    gen = torch.Generator().manual_seed(0)
    inputs = [
        (torch.rand(t.shape, generator=gen) + 0.5).to(getattr(torch, _dtype(t.dtype)))
        for t in g.inputs
    ]
    scalars = [0.5] * g.num_scalar_inputs
    outs = []
    for level in (1, 3):
        loaded = execute.load(_exe(graph, level))
        outs.append(
            loaded.run([x.clone() for x in inputs], scalars, torch.Generator().manual_seed(1))
        )
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def _dtype(code: int) -> str:
    from trnsim.simulator import dtypes

    return dtypes.name(code)


def test_the_level_is_part_of_the_cache_key():
    g = mlp()
    target = get_target("trn2")
    keys = {lvl: cache_key(g, target, ex.CompileOptions(opt_level=lvl)).digest for lvl in range(4)}
    assert keys[0] == keys[1] and len({keys[1], keys[2], keys[3]}) == 3


def test_an_unknown_level_is_refused():
    with pytest.raises(CompileError, match="opt_level 4"):
        _exe(mlp(), 4)


def test_modelled_compile_time_grows_with_the_graph_and_the_level():
    b = GraphBuilder("relu")
    x = b.input([64, 64])
    one_op = b.build(b.op("aten::relu.default", x, out=f32(64, 64)))
    small = _exe(one_op, 1).modelled_compile_seconds
    assert 0.01 <= small < 1.0, "a per-op kernel: tens to hundreds of milliseconds"
    block = [_exe(GPT[0], level).modelled_compile_seconds for level in (1, 2, 3)]
    assert 10.0 <= block[1] < 100.0, "a transformer's fused graph at -O2: tens of seconds"
    assert block[0] < block[1] < block[2]
    assert _exe(GPT[0], 2).modelled_compile_seconds == block[1], "deterministic"


def test_explain_says_what_was_searched(tmp_path, capsys):
    path = Path(__file__).resolve().parents[2] / "examples" / "graphs" / "mlp.json"
    assert explain_main(["--explain", str(path), "-O", "3"]) == 0
    out = capsys.readouterr().out
    assert "schedule search: -O3:" in out and "against -O1's" in out
    assert "modelled compile time" in out


def test_run_passes_logs_each_level():
    log = run_passes(GPT[0], "trn2", ex.CompileOptions(opt_level=2)).log
    line = next(entry for entry in log if entry.startswith("schedule search"))
    assert "schedules" in line and "% less" in line
