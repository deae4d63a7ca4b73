"""What the daemon refuses (daemon/wire.py request_problem): operators its list does not have
(UNKNOWN_OP: the client compiles those itself), arguments their schemas do not take, scalar
counts beyond any graph and tensor extents beyond int64 (INVALID_REQUEST). Each answer names
the node, and nothing is compiled or cached. And its statistics stay the same size however
many compiles it counts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from trnsim.daemon import wire
from trnsim.daemon.service import Histogram
from trnsim.protos import compile_service_pb2 as svc

from .helpers import answers, cache_rows, daemon_stats, request
from .op_schemas import OUT


def _op(name: str):
    def mutate(r: svc.CompileRequest) -> None:
        r.graph.nodes[0].op = name

    return mutate


def _extra_arg(r: svc.CompileRequest) -> None:
    r.graph.nodes[0].args.add(name="extra", none={})


def _missing_arg(r: svc.CompileRequest) -> None:
    del r.graph.nodes[0].args[1]


def _unknown_arg(r: svc.CompileRequest) -> None:
    r.graph.nodes[1].args[0].name = "not_an_argument"


def _scalars(r: svc.CompileRequest) -> None:
    r.graph.num_scalar_inputs = (1 << 32) - 1


def _offset(r: svc.CompileRequest) -> None:
    r.graph.inputs[0].storage_offset = 1 << 62


def _output_beyond_int64(r: svc.CompileRequest) -> None:
    r.graph.nodes[0].outputs[0].storage_offset = 1 << 62


CASES = {
    "os::system": (_op("os::system"), "node 0 (os::system): neither an operator of torch"),
    "no such overload": (_op("aten::add.NoSuchOverload"), "has no such operator"),
    "too many arguments": (_extra_arg, "node 0 (aten::mm.default): 3 arguments"),
    "missing argument": (_missing_arg, "missing argument 'mat2'"),
    "unknown argument": (_unknown_arg, "node 1 (aten::relu.default): no argument"),
    "2**32-1 scalars": (_scalars, "4294967295 scalar inputs, over the limit"),
    "2**62 offset": (_offset, "input 0: storage offset 4611686018427387904"),
    "output beyond int64": (_output_beyond_int64, "node 0 (aten::mm.default) output 0"),
}


UNKNOWN_OPS = ("os::system", "no such overload")


@pytest.mark.timeout(120)
def test_each_invalid_request_is_refused_and_nothing_is_cached(daemon):
    sent = []
    for i, (mutate, _) in enumerate(CASES.values()):
        r = request(i)
        mutate(r)
        sent.append(r)
    got = answers(daemon.address, *sent)
    for (name, (_, expected)), answer in zip(CASES.items(), got, strict=True):
        assert answer.WhichOneof("outcome") == "error", name
        unknown = name in UNKNOWN_OPS
        assert answer.error.error_class == (svc.UNKNOWN_OP if unknown else svc.INVALID_REQUEST)
        assert expected in answer.error.message, (name, answer.error.message)
    stats = daemon_stats(daemon.address)
    assert stats.compiles == 0 and stats.failures["UNKNOWN_OP"] == len(UNKNOWN_OPS)
    assert stats.failures["INVALID_REQUEST"] == len(CASES) - len(UNKNOWN_OPS)
    assert cache_rows(daemon.cache_dir, "") == []
    (valid,) = answers(daemon.address, request(0))  # the same graph, unbroken: compiled
    assert valid.WhichOneof("outcome") == "executable", valid.error.message


def test_a_custom_kernel_with_a_cost_passes():
    r = request(0)
    r.graph.nodes[1].op = "demo::rms_norm.default"
    assert wire.request_problem(r) is not None
    r.graph.nodes[1].cost.engine = "vector"
    assert wire.request_problem(r) is None


def test_the_op_list_matches_the_installed_torch():
    """Made in a fresh process: torch's registry grows with what a process has imported."""
    script = str(OUT.parents[1] / "tests" / "daemon" / "op_schemas.py")
    check = subprocess.run(
        [sys.executable, script, "--check"], check=False, capture_output=True, text=True
    )
    assert check.returncode == 0, f"{check.stdout}{check.stderr} (python {script} rewrites it)"
    assert wire.registry() is not None


def test_statistics_stay_the_same_size():
    h = Histogram()
    for k in range(200_000):
        h.add(0.001 * (1 + k % 5000))
    assert len(h.counts) == Histogram.BUCKETS and h.count == 200_000
    assert h.percentile(0.5) == pytest.approx(2.5, rel=0.03)
    assert h.percentile(0.99) == pytest.approx(4.95, rel=0.03)
    assert h.total == pytest.approx(sum(0.001 * (1 + k % 5000) for k in range(200_000)))


@pytest.mark.timeout(120)
def test_an_op_the_daemon_does_not_know_is_compiled_by_the_client(daemon):
    """An op registered after the list was written (a library the user imports) is real in
    the client's process: the daemon answers UNKNOWN_OP, the client compiles it itself, once,
    with one warning, and nothing reaches the daemon's cache."""
    from trnsim.client.core.compile_client import CompileJob, DaemonCompileClient, Tier

    client = DaemonCompileClient(daemon.address, auto_start=False)
    r = request(5)
    r.graph.nodes[1].op = "aten::relu.registered_later"
    try:
        with pytest.warns(RuntimeWarning, match="compiling in process.*registered_later"):
            compiled = client.compile(CompileJob(r.graph, r.target, r.options))
        assert compiled.tier is Tier.IN_PROCESS and client.local.compiles == 1
    finally:
        client.close()
    assert daemon_stats(daemon.address).failures["UNKNOWN_OP"] == 1
    assert cache_rows(daemon.cache_dir, "") == []
