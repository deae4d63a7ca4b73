"""A cache hit as a training rank sees it: read from the daemon's disk tier by the rank itself
(direct reads, the default) against asked of the daemon over its stream (before:
NEURON_COMPILE_DIRECT_READS=0).

    python benchmarks/rank_hits.py [--ranks 8] [--keys 90] [--calls 3000] [--seconds 5]

Starts its own daemon (one worker) and compiles `--keys` small graphs into its cache (about
what a first training step asks for). Then, each way: the latency of one hit
(`DaemonCompileClient.compile` of a cached graph, its key already computed, as
`Executables.get` calls it), p50/p99 over `--calls` calls in this process; and the hits per
second of `--ranks` rank processes asking for the keys in turn at once, each through a
client of its own, with the CPU time a hit costs the host (the ranks' and the daemon's:
on a machine shared with other work, hits per second follow the CPU left to the ranks,
CPU per hit does not). Prints both ways and their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trnsim.client.core.compile_client import DaemonCompileClient, Tier

from tests.daemon.helpers import daemon_stats, job, start_daemon

RANK = """
import json, sys, time
sys.path.insert(0, {repo!r})
from tests.daemon.helpers import job
from trnsim.client.core.compile_client import DaemonCompileClient
address, direct, keys, seconds = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), float(sys.argv[4])
client = DaemonCompileClient(address, auto_start=False, direct_reads=direct)
jobs = [job(i) for i in range(keys)]
for j in jobs:
    client.compile(j)  # (its key computed, the client connected)
print("ready", flush=True)
sys.stdin.readline()  # start together
start, cpu, n = time.perf_counter(), time.process_time(), 0
while time.perf_counter() - start < seconds:
    for j in jobs:
        client.compile(j)
    n += len(jobs)
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps([n, elapsed, cpu, dict(client.tiers)]), flush=True)
client.close()
"""


def pick(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(address: str, direct: bool, keys: int, calls: int) -> list[float]:
    """Seconds per hit, one at a time, in this process."""
    client = DaemonCompileClient(address, auto_start=False, direct_reads=direct)
    jobs = [job(i) for i in range(keys)]
    want = Tier.DIRECT if direct else Tier.MEMORY
    try:
        for j in jobs:
            assert client.compile(j).tier is want, "every key is cached"
        out = []
        for i in range(calls):
            j = jobs[i % keys]
            t = time.perf_counter()
            client.compile(j)
            out.append(time.perf_counter() - t)
        return out
    finally:
        client.close()


def ranks(
    address: str, daemon_pid: int, direct: bool, n: int, keys: int, seconds: float
) -> tuple[float, float]:
    """Hits per second of n rank processes at once, and the CPU seconds per hit they and
    the daemon spent."""
    code = RANK.format(repo=str(REPO))
    args = [address, "1" if direct else "0", str(keys), str(seconds)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    daemon = psutil.Process(daemon_pid)
    daemon_cpu = sum(daemon.cpu_times()[:2])
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    done = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, f"a rank failed ({p.returncode})"
        done.append(json.loads(out.strip().splitlines()[-1]))
    daemon_cpu = sum(daemon.cpu_times()[:2]) - daemon_cpu
    tiers = {name for _, _, _, t in done for name in t}
    assert tiers == ({"DIRECT"} if direct else {"MEMORY"}), tiers
    hits = sum(h for h, _, _, _ in done)
    cpu = daemon_cpu + sum(c for _, _, c, _ in done)
    return hits / max(elapsed for _, elapsed, _, _ in done), cpu / hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="rank processes (default 8)")
    parser.add_argument("--keys", type=int, default=90, help="cached graphs (default 90)")
    parser.add_argument("--calls", type=int, default=3000, help="hits timed one by one")
    parser.add_argument("--seconds", type=float, default=5.0, help="the ranks' run")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trn-hits-", dir="/tmp"))
    os.chmod(root, 0o700)
    daemon = start_daemon(root, "--workers", "1")
    try:
        client = DaemonCompileClient(daemon.address, auto_start=False, direct_reads=False)
        for f in [client.compile_async(job(i)) for i in range(args.keys)]:
            f.result(timeout=600)
        client.close()
        print(f"{args.keys} cached graphs, {os.cpu_count()} CPUs")
        rows = {}
        for direct, name in ((False, "daemon stream (before)"), (True, "direct reads")):
            times = latency(daemon.address, direct, args.keys, args.calls)
            rate, cpu = ranks(
                daemon.address, daemon.pid(), direct, args.ranks, args.keys, args.seconds
            )
            rows[direct] = (pick(times, 0.5), rate, cpu)
            print(
                f"{name:<24} one hit: p50 {pick(times, 0.5) * 1e6:7.1f} us  "
                f"p99 {pick(times, 0.99) * 1e6:7.1f} us   "
                f"{args.ranks} ranks: {rate:8.0f} hits/s, {cpu * 1e6:6.1f} CPU us a hit "
                f"({1 / cpu:7.0f} hits per CPU second)"
            )
        (rpc_p50, rpc_rate, rpc_cpu), (p50, rate, cpu) = rows[False], rows[True]
        print(
            f"direct / stream: p50 {p50 / rpc_p50:.3f}x, hits/s {rate / rpc_rate:.1f}x, "
            f"CPU a hit {cpu / rpc_cpu:.3f}x; "
            f"the daemon heard of {daemon_stats(daemon.address).direct_hits} direct hits (Touch)"
        )
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
