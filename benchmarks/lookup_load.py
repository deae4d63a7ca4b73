"""Lookup latency of a cache hit while many clients keep the daemon busy.

    python benchmarks/lookup_load.py [--clients 64] [--load streams|lookups] [--seconds 15]

Starts its own daemon (one worker), compiles a few small graphs into its cache, then measures
a probe client's unary Lookup of a cached key (one call at a time, 5 ms apart) three ways:
alone; while `--clients` clients stream Compile cache hits (one request in flight each,
as a training process does); and while they send Lookups instead (`--load lookups`). The
load clients are threads spread over a few processes (`--procs`) that import only grpc and
the protos, so 64 of them fit on a small machine. Prints p50/p99 of the probe's Lookup and of
the load's own calls, and the load's calls per second.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trnsim.protos import compile_service_pb2 as svc

SERVICE = "/trnsim.service.CompileService/"
GRAPHS = 8


def pick(values: list[float], q: float) -> float:
    """The q-quantile of values, in ms."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the load: threads of one process, each a client of its own --------------------------------
def stream_client(address: str, requests: list[bytes], stop: float, out: list[float]) -> None:
    """A Compile stream with one request in flight at a time until `stop`."""
    outbox: queue.Queue[bytes | None] = queue.Queue()
    with grpc.insecure_channel(address) as ch:
        call = ch.stream_stream(
            SERVICE + "Compile", response_deserializer=svc.CompileResult.FromString
        )
        answers = call(iter(outbox.get, None), timeout=stop - time.time() + 120)
        i = 0
        while time.time() < stop:
            t = time.perf_counter()
            message = svc.CompileRequest.FromString(requests[i % len(requests)])
            message.id = i + 1
            outbox.put(message.SerializeToString())
            answer = next(answers)
            assert answer.WhichOneof("outcome") == "executable", answer.error.message
            out.append(time.perf_counter() - t)
            i += 1
        outbox.put(None)
        for _ in answers:
            pass


def lookup_client(
    address: str, lookup: bytes, stop: float, out: list[float], pause_s: float = 0.0
) -> None:
    """Unary Lookups of cached keys, one at a time, until `stop`."""
    with grpc.insecure_channel(address) as ch:
        call = ch.unary_unary(
            SERVICE + "Lookup", response_deserializer=svc.LookupResponse.FromString
        )
        while time.time() < stop:
            t = time.perf_counter()
            response = call(lookup, timeout=60)
            assert all(e.found for e in response.entries), "a cached key was not found"
            out.append(time.perf_counter() - t)
            if pause_s:
                time.sleep(pause_s)


def load_process(spec: dict[str, object]) -> None:
    """One load process: `threads` clients of kind `load`; prints its latencies as JSON."""
    address, load, stop = str(spec["address"]), str(spec["load"]), float(spec["stop"])  # type: ignore[arg-type]
    requests = [bytes.fromhex(r) for r in spec["requests"]]  # type: ignore[attr-defined]
    lookup = bytes.fromhex(str(spec["lookup"]))
    latencies: list[list[float]] = []
    threads = []
    for _ in range(int(spec["threads"])):  # type: ignore[call-overload]
        mine: list[float] = []
        latencies.append(mine)
        if load == "streams":
            target, args = stream_client, (address, requests, stop, mine)
        else:
            target, args = lookup_client, (address, lookup, stop, mine)  # type: ignore[assignment]
        threads.append(threading.Thread(target=target, args=args, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps([x for mine in latencies for x in mine]))


# -- the run ------------------------------------------------------------------------------------
def warm(address: str) -> tuple[list[bytes], bytes]:
    """Compiles the graphs; their requests and a Lookup of their keys."""
    from tests.daemon.helpers import answers, request

    requests = [request(i) for i in range(GRAPHS)]
    results = answers(address, *requests)
    assert all(r.WhichOneof("outcome") == "executable" for r in results)
    lookup = svc.LookupRequest(
        cache_keys=[results[0].cache_key],
        compiler_version=requests[0].compiler_version,
        format_version=requests[0].format_version,
    )
    return [r.SerializeToString() for r in requests], lookup.SerializeToString()


def probe(address: str, lookup: bytes, seconds: float) -> list[float]:
    out: list[float] = []
    lookup_client(address, lookup, time.time() + seconds, out, pause_s=0.005)
    return out


def under_load(
    address: str,
    load: str,
    clients: int,
    procs: int,
    seconds: float,
    reqs: list[bytes],
    lookup: bytes,
) -> tuple[list[float], list[float]]:
    """The probe's Lookup latencies and the load's own, with `clients` clients running."""
    stop = time.time() + seconds + 3  # (3 s for the load to start)
    spawned = []
    for p in range(procs):
        threads = clients // procs + (1 if p < clients % procs else 0)
        spec = {
            "address": address,
            "load": load,
            "stop": stop,
            "threads": threads,
            "requests": [r.hex() for r in reqs],
            "lookup": lookup.hex(),
        }
        cmd = [sys.executable, __file__, "--load-process", json.dumps(spec)]
        spawned.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    time.sleep(3)
    mine = probe(address, lookup, seconds)
    theirs: list[float] = []
    for child in spawned:
        out, _ = child.communicate(timeout=seconds + 300)
        assert child.returncode == 0, f"a load process failed ({child.returncode})"
        theirs += json.loads(out.strip().splitlines()[-1])
    return mine, theirs


def report(name: str, values: list[float], seconds: float) -> None:
    print(
        f"{name:<44} n={len(values):>6}  p50 {pick(values, 0.5):8.2f} ms  "
        f"p99 {pick(values, 0.99):8.2f} ms  ({len(values) / seconds:7.0f}/s)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64, help="load clients (default 64)")
    parser.add_argument(
        "--load",
        choices=["streams", "lookups", "both"],
        default="both",
        help="what the load clients send: Compile cache hits, Lookups, or each in turn",
    )
    parser.add_argument("--procs", type=int, default=4, help="processes the clients run in")
    parser.add_argument("--seconds", type=float, default=15.0, help="per measurement")
    parser.add_argument("--address", help="an already running daemon (else one is started)")
    parser.add_argument("--load-process", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load_process:
        load_process(json.loads(args.load_process))
        return 0
    from tests.daemon.helpers import start_daemon

    daemon = None
    address = args.address
    if address is None:
        root = Path(tempfile.mkdtemp(prefix="trn-lk-", dir="/tmp"))
        root.chmod(0o700)
        daemon = start_daemon(root, "--workers", "1")
        address = daemon.address
    try:
        reqs, lookup = warm(address)
        alone = probe(address, lookup, min(args.seconds, 5.0))
        report("Lookup alone", alone, min(args.seconds, 5.0))
        loads = ["streams", "lookups"] if args.load == "both" else [args.load]
        for load in loads:
            mine, theirs = under_load(
                address, load, args.clients, args.procs, args.seconds, reqs, lookup
            )
            report(f"Lookup, {args.clients} clients sending {load}", mine, args.seconds)
            report(f"  the {args.clients} clients' own {load}", theirs, args.seconds)
            if theirs:
                print(f"  (load mean {1000 * statistics.fmean(theirs):.2f} ms)")
    finally:
        if daemon is not None:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
