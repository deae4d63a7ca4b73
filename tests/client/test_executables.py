"""A compile job is hashed once; a compile's answer keeps the request's wait beside the
executable, never in it; the runtime's executables are cached by that one key."""

from __future__ import annotations

import pytest
from trnsim import compiler
from trnsim.client.core import compile_client as cc
from trnsim.compiler.graph import GraphBuilder, TensorType, to_proto
from trnsim.protos import executable_pb2, graph_pb2
from trnsim.simulator.config import get_target

from .differential import fresh_core


def _graph(n: int = 8):  # type: ignore[no-untyped-def]
    b = GraphBuilder("relu")
    x = b.input([n, n])
    return b.build(b.op("aten::relu.default", x, out=TensorType.contiguous([n, n])))


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the compile client hashed a graph (compiler.cache_key_from_proto)."""
    calls = [0]
    real = compiler.cache_key_from_proto

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "cache_key_from_proto", counted)
    return calls


def test_a_job_hashes_its_graph_once_to_the_compilers_key(hashes: list[int]) -> None:
    options = executable_pb2.CompileOptions(opt_level=2)
    job = cc.CompileJob(to_proto(_graph()), "trn2", options)
    assert job.key == job.key == compiler.cache_key(_graph(), get_target("trn2"), options).digest
    assert hashes == [1]


def test_an_in_process_compile_waits_all_of_it_and_the_executable_keeps_no_wait() -> None:
    job = cc.CompileJob(to_proto(_graph()), "trn2", executable_pb2.CompileOptions())
    compiled = cc.InProcessCompileClient().compile(job)
    assert compiled.tier is cc.Tier.IN_PROCESS and not compiled.fetched
    assert compiled.waited_seconds == compiled.executable.modelled_compile_seconds > 0
    assert compiled.executable.cache_key == job.key
    assert "waited_compile_seconds" not in executable_pb2.Executable.DESCRIPTOR.fields_by_name


def test_a_cache_hit_is_fetched() -> None:
    exe = executable_pb2.Executable(modelled_compile_seconds=1.5)
    assert cc.Compiled(exe, 0.0, cc.Tier.DISK).fetched
    assert not cc.Compiled(exe, 0.5, cc.Tier.JOINED).fetched


def test_the_runtime_hashes_a_compile_once_and_finds_it_again(hashes: list[int]) -> None:
    with fresh_core("eager") as rt:
        hashes[0] = 0
        debug = graph_pb2.GraphDebug(name="relu")
        loaded = rt.executables.get(_graph(5), debug)
        assert hashes == [1], "hashed once for the cache, the compile and the answer"
        assert rt.executables.get(_graph(5), debug) is loaded and hashes == [2]
        counts = rt.metrics.counts
        assert counts["executables_compiled"] == 1 and counts["executable_cache_hits"] == 1
        (miss,) = rt.executables.misses
        assert (miss.name, miss.ops, miss.key) == ("relu", 1, next(iter(rt.executables.loaded)))
