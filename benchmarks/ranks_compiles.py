"""Compiles made by one daemon for N ranks of the same model, against one rank alone.

    python benchmarks/ranks_compiles.py [--ranks 1,8] [--runs 5] [--mode adaptive]

Each run launches benchmarks/ttfs_rank.py under the real torchrun (`--nproc_per_node N`),
once per N, each time through a fresh daemon on a fresh cache, waits until the daemon has
finished every compile asked for (background ones of ranks that already exited included),
and prints its counters: compiles made, distinct executables in its cache, requests, joins,
jobs dropped. N ranks of the same work should make exactly the compiles one rank makes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from trnsim.daemon import launcher
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def start_daemon(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    address = f"unix:{root / 'run' / 'c.sock'}"
    (root / "run").mkdir(mode=0o700)
    cmd = [sys.executable, "-m", "trnsim.daemon", "--address", address]
    cmd += ["--cache-dir", str(root / "cache")]
    with open(root / "daemon.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while launcher.get_info(address, timeout=0.5) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the daemon did not start: {(root / 'daemon.log').read_text()}")
        time.sleep(0.05)
    return proc, address


def stats(address: str) -> svc.StatsResponse:
    with grpc.insecure_channel(address) as channel:
        return svc_grpc.CompileServiceStub(channel).Stats(svc.StatsRequest(), timeout=30)


def settled(address: str, timeout_s: float = 600) -> svc.StatsResponse:
    """The counters once nothing is queued or compiling."""
    deadline = time.monotonic() + timeout_s
    s = stats(address)
    while (s.queue_depth or s.in_flight) and time.monotonic() < deadline:
        time.sleep(0.2)
        s = stats(address)
    return s


def executables(cache: Path) -> int:
    db = sqlite3.connect(f"file:{cache / 'executables' / 'cache.db'}?mode=ro", uri=True)
    try:
        return sum(1 for (k,) in db.execute("select key from Cache") if str(k).startswith("exe:"))
    finally:
        db.close()


def run(n: int, mode: str) -> dict[str, int]:
    root = Path(tempfile.mkdtemp(prefix="ranks-", dir="/tmp"))
    os.chmod(root, 0o700)
    proc, address = start_daemon(root)
    try:
        env = {
            **os.environ,
            "NEURON_COMPILE_DAEMON": address,
            "NEURON_EAGER": mode,
            "OMP_NUM_THREADS": "1",
            "TTFS_OUT": str(root),
            "TTFS_T0": repr(time.time()),
        }
        subprocess.run(
            [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={n}"]
            + [str(HERE / "ttfs_rank.py")],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        s = settled(address)
        return {
            "compiles": s.compiles,
            "executables": executables(root / "cache"),
            "requests": s.requests,
            "joins": s.joins,
            "dropped": s.dropped_jobs,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,8")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mode", default="adaptive", help="NEURON_EAGER: eager or adaptive")
    args = parser.parse_args()
    ranks = [int(x) for x in args.ranks.split(",")]
    for i in range(1, args.runs + 1):
        counts = {n: run(n, args.mode) for n in ranks}
        line = ", ".join(
            f"{n} rank(s): {c['compiles']} compiles ({c['executables']} executables, "
            f"{c['requests']} requests, {c['joins']} joins, {c['dropped']} dropped)"
            for n, c in counts.items()
        )
        same = len({c["compiles"] for c in counts.values()}) == 1
        print(f"run {i} {args.mode}: {line}: {'equal' if same else 'DIFFERENT'}", flush=True)


if __name__ == "__main__":
    main()
