"""Many daemons and auto-starting clients on one socket path, and what is left of them: for
test_one_daemon.py and benchmarks/daemon_crowd.py. Uses only what every version of the
daemon has (its command line, the launcher, /proc), so that the benchmark can measure a
version before the path lock too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

# A process that keeps the cache's database under an exclusive lock, as a long VACUUM
# would: "locked" on stdout once it holds it, released after argv[2] seconds.
_HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""

# An auto-starting client: asks the launcher for a daemon until one answers (as a compile
# client in auto mode does, each RECONNECT_AFTER_S), then prints its pid.
_CLIENT = """
import sys, time
from trnsim.daemon import launcher
address, wait_s, give_up = sys.argv[1], float(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while time.monotonic() < give_up:
    try:
        info = launcher.ensure_daemon(address, wait_s=wait_s, idle_exit_s=60.0)
    except Exception as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        info = None
    if info is not None:
        print(info.pid, flush=True)
        break
    time.sleep(0.2)
else:
    print(0, flush=True)
"""


def start_daemons(
    address: str, cache_dir: Path, n: int, logs: Path, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    """n `python -m trnsim.daemon` on one address and cache, started together."""
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "trnsim.daemon", "--address", address]
    cmd += ["--cache-dir", str(cache_dir), "--workers", "1"]
    procs = []
    for i in range(n):
        with open(logs / f"daemon-{i}.log", "wb") as out:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=out, env=env))
    return procs


def start_clients(
    address: str, n: int, env: dict[str, str], wait_s: float, give_up_s: float
) -> list[subprocess.Popen[str]]:
    """n auto-starting clients of address (see _CLIENT), started together."""
    cmd = [sys.executable, "-c", _CLIENT, address, str(wait_s), str(give_up_s)]
    return [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(n)
    ]


def hold_exclusive(db: Path, seconds: float) -> subprocess.Popen[str]:
    """A process holding db under an exclusive lock for `seconds`, returned once it holds it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(db), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def daemons_on(address: str) -> list[psutil.Process]:
    """The live daemon processes started for address (their workers, and zombies, left out)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmdline = p.info["cmdline"] or []
        if p.info["status"] == psutil.STATUS_ZOMBIE or "trnsim.daemon" not in cmdline:
            continue
        if address in cmdline:
            found.append(p)
    return found


def listening_sockets(path: Path) -> int:
    """Unix sockets listening in path's directory, reachable at path or not. /proc/net/unix
    lists a socket under the name it was bound to: path itself for a daemon before the path
    lock, its private name (.bind-PID, renamed onto path) since; one whose file was unlinked
    or replaced is listed all the same. (The directory is the daemon's alone.)"""
    count = 0
    with open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            if len(fields) < 8 or not int(fields[3], 16) & 0x10000:
                continue
            if Path(fields[7]).parent == path.parent:
                count += 1
    return count


def settle(procs: list[subprocess.Popen[bytes]], alive: int, timeout_s: float) -> None:
    """Waits until at most `alive` of procs still run (the refused ones have exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and sum(p.poll() is None for p in procs) > alive:
        time.sleep(0.05)


def stop_all(address: str, timeout_s: float = 30.0) -> None:
    """SIGTERM to every daemon on address, then SIGKILL to what is left after timeout_s."""
    procs = daemons_on(address)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=10)


def child_env(cache_dir: Path) -> dict[str, str]:
    """The environment of the started processes: the caller's, its cache, no compile client."""
    return {**os.environ, "NEURON_CACHE_DIR": str(cache_dir), "NEURON_COMPILE_DAEMON": "off"}
