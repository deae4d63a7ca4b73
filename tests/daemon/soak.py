"""A bounded soak of the daemon: many client processes asking for cached graphs at once.

    python tests/daemon/soak.py [--clients 64] [--seconds 30]

Starts its own daemon, compiles a few graphs into its cache, then runs each client as its
own process: one stream each, one request in flight at a time, for the given time. Prints
requests, errors and the hit latency's p50/p99 over every client; exit status 1 on errors.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GRAPHS = 8
CLIENT = """
import json, sys, time
from trnsim.client.core.compile_client import DaemonCompileClient
from tests.daemon.helpers import request
address, seconds, graphs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
client = DaemonCompileClient(address, auto_start=False)
requests = [request(i) for i in range(graphs)]
latencies, errors, i, first = [], 0, 0, ""
start = time.monotonic()
while time.monotonic() - start < seconds:
    r = requests[i % graphs]
    i += 1
    t = time.perf_counter()
    try:
        result = client.submit(r).result(timeout=60)
        if result.WhichOneof("outcome") != "executable":
            errors += 1
            first = first or result.error.message
    except Exception as e:
        errors += 1
        first = first or f"{type(e).__name__}: {e}"
    latencies.append(time.perf_counter() - t)
client.close()
print(json.dumps({"latencies": latencies, "errors": errors, "first_error": first}))
"""


def soak(address: str, clients: int, seconds: float) -> dict[str, Any]:
    """Every client's requests, errors and the p50/p99 hit latency in ms."""
    repo = str(Path(__file__).resolve().parents[2])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, address, str(seconds), str(GRAPHS)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=repo,
        )
        for _ in range(clients)
    ]
    latencies: list[float] = []
    errors = failed = 0
    reasons: dict[str, int] = {}  # each client's first error
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 300)
        if p.returncode != 0:
            failed += 1
            continue
        report = json.loads(out.strip().splitlines()[-1])
        latencies += report["latencies"]
        errors += report["errors"]
        if report["first_error"]:
            reasons[report["first_error"]] = reasons.get(report["first_error"], 0) + 1
    latencies.sort()

    def pick(q: float) -> float:
        return 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": errors,
        "failed_clients": failed,
        "p50_ms": pick(0.5) if latencies else 0.0,
        "p99_ms": pick(0.99) if latencies else 0.0,
        "first_errors": reasons,
    }


def warm(address: str) -> None:
    from trnsim.client.core.compile_client import DaemonCompileClient

    from tests.daemon.helpers import request

    client = DaemonCompileClient(address, auto_start=False)
    try:
        for f in [client.submit(request(i)) for i in range(GRAPHS)]:
            assert f.result(timeout=120).WhichOneof("outcome") == "executable"
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.daemon.helpers import start_daemon

    root = Path(tempfile.mkdtemp(prefix="trn-soak-", dir="/tmp"))
    root.chmod(0o700)
    d = start_daemon(root, "--workers", "2")
    try:
        warm(d.address)
        started = time.monotonic()
        report = soak(d.address, args.clients, args.seconds)
        alive = d.proc.poll() is None
    finally:
        d.stop()
    print(
        f"{report['clients']} clients for {args.seconds:.0f} s ({time.monotonic() - started:.0f} s "
        f"with start-up): {report['requests']} requests, errors {report['errors']}, clients "
        f"failed {report['failed_clients']}; hit latency p50 {report['p50_ms']:.2f} ms, "
        f"p99 {report['p99_ms']:.2f} ms; daemon alive {alive}"
    )
    for reason, n in report["first_errors"].items():
        print(f"  {n} clients first failed with: {reason}")
    return 0 if alive and not report["errors"] and not report["failed_clients"] else 1


if __name__ == "__main__":
    sys.exit(main())
