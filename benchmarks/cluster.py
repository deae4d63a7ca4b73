"""A cold cluster, with and without the remote cache tier: 4 simulated hosts x 2 ranks.

    python benchmarks/cluster.py [--hosts 4] [--ranks 2] [--mode eager] [--scale 0.2]

Each host is a torchrun launch of --ranks ranks (benchmarks/ttfs_rank.py: a small Llama-style
model to its first step) with its own NEURON_SIM_NODE, so its own auto-started daemon, and its
own cache directory: hosts share nothing but, in the second setting, a Redis server this
script starts (a Unix socket in a temporary directory) and a cluster key. The hosts start one
after another, as hosts joining a job do. Printed per setting and host: the daemon's compiles,
remote hits, time to first step (launch to the slowest rank's first loss.item()) and its
compile part; then total compiles, and each later host's time to first step against a warm
host's (host 1 launched again on its own warm cache: what the tier costs a warm run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ttfs import daemon_stats, launch, stop_daemon


def start_redis(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is missing: `make setup` installs it (Debian's package)")
    sock = root / "redis.sock"
    proc = subprocess.Popen(
        [server, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
         "--save", "", "--appendonly", "no", "--dir", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc, f"unix://{sock}?db=0"


def host(n: int, base: dict[str, str], work: Path, ranks: int, label: str) -> dict[str, float]:
    env = {**base, "NEURON_SIM_NODE": f"host{n}", "NEURON_CACHE_DIR": str(work / f"host{n}")}
    began = time.monotonic()
    result = launch(ranks, env, work / f"out-{label}-{n}")
    stats = daemon_stats(env)
    print(f"  {label}: launched in {time.monotonic() - began:.1f} s", file=sys.stderr)
    return {
        "compiles": int(stats.get("compiles", 0)),
        "remote_hits": int(stats.get("remote", {}).get("hits", 0)),
        "wall": max(r["ttfs_wall_s"] for r in result),
        "compile": max(r["compile_wait_wall_s"] for r in result),
    }


def setting(
    name: str, base: dict[str, str], work: Path, hosts: int, ranks: int
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Hosts 1..N cold one after another, then host 1 again, warm; every daemon stopped after."""
    envs = []
    try:
        rows = []
        for n in range(1, hosts + 1):
            envs.append({**base, "NEURON_SIM_NODE": f"host{n}"})
            rows.append(host(n, base, work, ranks, f"{name} host {n}"))
        warm = host(1, base, work, ranks, f"{name} host 1 again")
        warm["compiles"] -= rows[0]["compiles"]
        warm["remote_hits"] -= rows[0]["remote_hits"]
        return rows, warm
    finally:
        for env in envs:
            stop_daemon(env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4, help="simulated hosts (default 4)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks per host (default 2)")
    parser.add_argument("--mode", default="eager", help="NEURON_EAGER: eager or adaptive")
    parser.add_argument(
        "--scale",
        type=float,
        default=0.2,
        help="CPU seconds a compile burns per modelled second (NEURON_SIM_COMPILE_SCALE)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cluster-", dir="/tmp") as tmp:
        work = Path(tmp)
        runtime = work / "run"
        runtime.mkdir(mode=0o700)
        key = work / "cluster.key"
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
        base = {
            **os.environ,
            "NEURON_EAGER": args.mode,
            "NEURON_SIM_COMPILE_SCALE": str(args.scale),
            "NEURON_SIM_COMPILE_CLOCK": "on",
            "NEURON_COMPILE_DAEMON": "auto",
            "XDG_RUNTIME_DIR": str(runtime),
            "OMP_NUM_THREADS": "1",
        }
        for k in ("NEURON_CACHE_REMOTE", "NEURON_CACHE_REMOTE_KEY_FILE", "NEURON_SIM_NODE"):
            base.pop(k, None)
        results = {}
        results["no remote tier"] = setting("local", base, work / "local", args.hosts, args.ranks)
        redis, url = start_redis(work)
        try:
            remote = {
                **base,
                "NEURON_CACHE_REMOTE": url,
                "NEURON_CACHE_REMOTE_KEY_FILE": str(key),
            }
            results["remote tier"] = setting(
                "remote", remote, work / "remote", args.hosts, args.ranks
            )
        finally:
            redis.send_signal(signal.SIGTERM)
            redis.wait()
    print(
        f"\n{args.hosts} hosts x {args.ranks} ranks, {args.mode} mode, compile scale {args.scale}"
    )
    print(
        f"{'setting':16} {'host':>4} {'compiles':>9} {'remote hits':>12} {'ttfs s':>8} {'compile s':>10}"
    )
    for name, (rows, warm) in results.items():
        for n, r in enumerate(rows, 1):
            print(
                f"{name:16} {n:>4} {r['compiles']:>9} {r['remote_hits']:>12} "
                f"{r['wall']:8.2f} {r['compile']:10.2f}"
            )
        print(
            f"{name:16} {'1 w':>4} {warm['compiles']:>9} {warm['remote_hits']:>12} "
            f"{warm['wall']:8.2f} {warm['compile']:10.2f}   (host 1 again, warm)"
        )
    for name, (rows, warm) in results.items():
        total = sum(r["compiles"] for r in rows)
        later = ", ".join(f"{r['wall'] / warm['wall']:.2f}" for r in rows[1:])
        print(
            f"{name}: total compiles {total} (one host's: {rows[0]['compiles']}); "
            f"hosts 2-{len(rows)} ttfs / warm host's: {later}"
        )
    (_, warm_local), (_, warm_remote) = results.values()
    print(
        f"a warm host with the remote tier / without: ttfs "
        f"{warm_remote['wall'] / warm_local['wall']:.2f}"
    )


if __name__ == "__main__":
    main()
