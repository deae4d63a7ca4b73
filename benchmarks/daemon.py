"""The compile daemon's speed, measured in one run on this machine.

    python benchmarks/daemon.py [--quick]

- cache-hit round trip over the Unix socket, p50/p99: unary Lookup and the Compile stream;
- streamed cache hits per second with 1, 8 and 64 concurrent client processes;
- compile throughput of the worker pool vs a single worker (cold cache), and the ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trnsim import compiler
from trnsim.client.core.compile_client import DaemonCompileClient
from trnsim.compiler.graph import GraphBuilder, TensorType, to_proto
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc
from trnsim.protos import executable_pb2
from trnsim.simulator.config import get_target

from tests.daemon.helpers import graph, request, start_daemon

CLIENT = """
import sys, time
sys.path.insert(0, {repo!r})
from tests.daemon.helpers import request
from trnsim.client.core.compile_client import DaemonCompileClient
address, n, window, graphs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
client = DaemonCompileClient(address, auto_start=False)
reqs = [request(i % graphs) for i in range(n)]
client.submit(reqs[0]).result()
print("ready", flush=True)
sys.stdin.readline()  # start together
start = time.perf_counter()
pending = []
for r in reqs:
    pending.append(client.submit(r))
    if len(pending) >= window:
        pending.pop(0).result()
for f in pending:
    f.result()
print(n / (time.perf_counter() - start), flush=True)
"""


ECHO_SERVER = """
import asyncio, sys
import grpc
from trnsim.protos import compile_service_pb2 as svc, compile_service_pb2_grpc as g
class Echo(g.CompileServiceServicer):
    async def GetInfo(self, request, context):
        return svc.GetInfoResponse(pid=1)
    async def Compile(self, requests, context):
        async for r in requests:
            yield svc.CompileResult(id=r.id)
async def main():
    server = grpc.aio.server()
    g.add_CompileServiceServicer_to_server(Echo(), server)
    server.add_insecure_port(sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""


def transport_floor(root: Path, n: int) -> None:
    """The same round trips against a server that does nothing: Python gRPC's own cost."""
    address = f"unix:{root / 'echo.sock'}"
    proc = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, address], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with grpc.insecure_channel(address) as ch:
            stub = svc_grpc.CompileServiceStub(ch)
            stub.GetInfo(svc.GetInfoRequest())
            unary = []
            for _ in range(n):
                t = time.perf_counter()
                stub.GetInfo(svc.GetInfoRequest())
                unary.append(time.perf_counter() - t)
            import queue

            outbox: queue.Queue[svc.CompileRequest | None] = queue.Queue()

            def requests():  # type: ignore[no-untyped-def]
                while (r := outbox.get()) is not None:
                    yield r

            responses = stub.Compile(requests())
            stream = []
            for i in range(n):
                t = time.perf_counter()
                outbox.put(svc.CompileRequest(id=i))
                next(responses)
                stream.append(time.perf_counter() - t)
            outbox.put(None)
        print(
            f"transport floor (an echo server), unary   : p50 {pct(unary, 0.5) * 1e6:7.0f} us   p99 {pct(unary, 0.99) * 1e6:7.0f} us"
        )
        print(
            f"transport floor (an echo server), stream  : p50 {pct(stream, 0.5) * 1e6:7.0f} us   p99 {pct(stream, 0.99) * 1e6:7.0f} us"
        )
    finally:
        proc.kill()
        proc.wait()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(address: str, graphs: int, n: int) -> None:
    version, fmt = compiler.compiler_version(), compiler.FORMAT_VERSION
    keys = [
        compiler.cache_key(graph(i), get_target("trn2"), executable_pb2.CompileOptions()).digest
        for i in range(graphs)
    ]
    with grpc.insecure_channel(address) as ch:
        stub = svc_grpc.CompileServiceStub(ch)
        lookup = []
        for i in range(n):
            t = time.perf_counter()
            resp = stub.Lookup(
                svc.LookupRequest(
                    cache_keys=[keys[i % graphs]], compiler_version=version, format_version=fmt
                )
            )
            lookup.append(time.perf_counter() - t)
            assert resp.entries[0].found
    client = DaemonCompileClient(address, auto_start=False)
    reqs = [request(i % graphs) for i in range(n)]
    client.submit(reqs[0]).result()
    stream = []
    for r in reqs:
        t = time.perf_counter()
        result = client.submit(r).result()
        stream.append(time.perf_counter() - t)
        assert result.tier in (svc.MEMORY, svc.DISK)
    client.close()
    for name, xs in (("unary Lookup", lookup), ("Compile stream", stream)):
        print(
            f"cache-hit round trip, {name:<14}: p50 {pct(xs, 0.5) * 1e6:7.0f} us   p99 {pct(xs, 0.99) * 1e6:7.0f} us   ({len(xs)} calls)"
        )


def throughput(address: str, clients: int, per_client: int, graphs: int) -> float:
    code = CLIENT.format(repo=str(REPO))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, address, str(per_client), "32", str(graphs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(clients)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    start = time.perf_counter()
    for p in procs:
        p.communicate(timeout=600)
    elapsed = time.perf_counter() - start
    return clients * per_client / elapsed


def big_graph(i: int, length: int = 160):
    b = GraphBuilder(f"chain{i}")
    v = b.input([256, 256 + i])
    for j in range(length):
        op = "aten::exp.default" if j % 2 else "aten::relu.default"
        v = b.op(op, v, out=TensorType.contiguous([256, 256 + i]))
    return b.build(v)


def compile_throughput(root: Path, workers: int, graphs: int) -> float:
    d = start_daemon(root / f"w{workers}", "--workers", str(workers))
    try:
        client = DaemonCompileClient(d.address, auto_start=False)
        reqs = []
        for i in range(graphs):
            r = request(0)
            r.graph.CopyFrom(to_proto(big_graph(i)))
            reqs.append(r)
        start = time.perf_counter()
        futures = [client.submit(r) for r in reqs]
        for f in futures:
            assert f.result(timeout=600).tier == svc.COMPILED
        elapsed = time.perf_counter() - start
        client.close()
        return graphs / elapsed
    finally:
        d.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    args = parser.parse_args()
    n = 300 if args.quick else 3000
    root = Path(tempfile.mkdtemp(prefix="trn-bench-", dir="/tmp"))
    os.chmod(root, 0o700)
    try:
        d = start_daemon(root, "--workers", "2")
        try:
            graphs = 20
            client = DaemonCompileClient(d.address, auto_start=False)
            for f in [client.submit(request(i)) for i in range(graphs)]:
                f.result()
            client.close()
            latency(d.address, graphs, n)
            transport_floor(root, n)
            rates = {}
            for clients in (1, 8, 64):
                per = max(50, (n * 4) // clients)
                rates[clients] = throughput(d.address, clients, per, graphs)
                print(
                    f"streamed cache hits, {clients:>2} client processes: {rates[clients]:8.0f} hits/s"
                )
            print(
                f"ratio 8 clients / 1 client: {rates[8] / rates[1]:.2f}x; 64 / 1: {rates[64] / rates[1]:.2f}x"
            )
        finally:
            d.stop()
        count = 8 if args.quick else 24
        pool_workers = max(2, os.cpu_count() or 2)
        pool = compile_throughput(root, pool_workers, count)
        single = compile_throughput(root, 1, count)
        print(
            f"compile throughput: pool of {pool_workers} {pool:.1f} graphs/s, one worker {single:.1f} graphs/s, ratio {pool / single:.2f}x"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
