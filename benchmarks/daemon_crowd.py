"""How many daemons one socket path ends up with, measured in one run on this machine.

    python benchmarks/daemon_crowd.py [--trials 10] [--starts 10] [--lock-s 45] [--clients 3]

- crowd: `--starts` daemons started at the same instant on one path and cache, `--trials`
  times: per trial, the daemons alive afterwards, the sockets listening in the path's
  directory (an unreachable one counts), and which pid answers;
- locked: the cache's database held under an exclusive lock for `--lock-s` seconds (a long
  VACUUM) while `--clients` auto-starting clients ask the launcher for a daemon again and
  again: the most daemons alive at once, and after the lock those alive and listening.

Every count should be 1. The script uses only the daemon's command line, the launcher and
/proc, so it measures an older version as well (PYTHONPATH pointing at its checkout).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trnsim.daemon import launcher
from trnsim.daemon.cache import ExecutableCache

from tests.daemon.crowd import (
    child_env,
    daemons_on,
    hold_exclusive,
    listening_sockets,
    settle,
    start_clients,
    start_daemons,
    stop_all,
)


def _scratch() -> Path:
    """A short private directory (Unix socket paths are limited to ~107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="crowd-", dir="/tmp"))
    os.chmod(root, 0o700)
    return root


def crowd_trial(starts: int) -> tuple[int, int, int]:
    """(daemons alive, sockets listening, daemons that exited) after `starts` at once."""
    root = _scratch()
    address = f"unix:{root / 'run' / 'c.sock'}"
    cache = root / "cache"
    try:
        procs = start_daemons(address, cache, starts, root / "logs", child_env(cache))
        settle(procs, alive=1, timeout_s=60)
        deadline = time.monotonic() + 30
        while launcher.get_info(address, timeout=1) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # (a late binder would show here)
        alive = len(daemons_on(address))
        listening = listening_sockets(root / "run" / "c.sock")
        exited = sum(p.poll() is not None for p in procs)
        return alive, listening, exited
    finally:
        stop_all(address)
        for p in procs:
            p.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def locked_trial(lock_s: float, clients: int, client_wait_s: float) -> dict[str, object]:
    """The locked-cache case: the counts, and the pids the clients got."""
    root = _scratch()
    address = f"unix:{root / 'run' / 'c.sock'}"
    cache = root / "cache"
    cache.mkdir(mode=0o700)
    ExecutableCache(cache / "executables", 1 << 20, 1 << 24).close()
    started = time.monotonic()
    holder = hold_exclusive(cache / "executables" / "cache.db", lock_s)
    procs = start_clients(address, clients, child_env(cache), client_wait_s, lock_s + 90)
    try:
        most = 0
        while holder.poll() is None:
            most = max(most, len(daemons_on(address)))
            time.sleep(0.2)
        holder.communicate()
        got = [p.communicate(timeout=lock_s + 120)[0].strip() for p in procs]
        time.sleep(1.0)
        return {
            "most alive during the lock": most,
            "alive after": len(daemons_on(address)),
            "listening after": listening_sockets(root / "run" / "c.sock"),
            "pids the clients got": sorted(set(got)),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        stop_all(address)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trials", type=int, default=10, help="crowd trials (default 10)")
    p.add_argument("--starts", type=int, default=10, help="daemons started at once (default 10)")
    p.add_argument(
        "--lock-s", type=float, default=45.0, help="seconds cache.db stays locked (default 45)"
    )
    p.add_argument("--clients", type=int, default=3, help="auto-starting clients (default 3)")
    p.add_argument(
        "--client-wait",
        type=float,
        default=launcher.START_WAIT_S if hasattr(launcher, "START_WAIT_S") else 15.0,
        help="seconds each launcher call waits for the daemon to answer (default 15)",
    )
    p.add_argument("--only", choices=["crowd", "locked"], help="one of the two cases")
    args = p.parse_args()
    print(f"trnsim.daemon from {Path(launcher.__file__).parent}")
    if args.only != "locked":
        print(f"crowd: {args.starts} daemons started at once on one path, {args.trials} trials")
        print("trial  alive  listening  exited")
        one = 0
        for trial in range(1, args.trials + 1):
            alive, listening, exited = crowd_trial(args.starts)
            one += alive == 1 and listening == 1
            print(f"{trial:5d}  {alive:5d}  {listening:9d}  {exited:6d}", flush=True)
        print(f"one daemon and one socket in {one} of {args.trials} trials")
    if args.only != "crowd":
        print(
            f"locked: cache.db exclusively locked for {args.lock_s:.0f} s, {args.clients} "
            f"auto-starting clients (each launcher call waits {args.client_wait:.0f} s)"
        )
        for name, value in locked_trial(args.lock_s, args.clients, args.client_wait).items():
            print(f"  {name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
