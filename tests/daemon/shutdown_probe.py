"""Stopping a daemon during a compile longer than its drain, as an operator would.

    python -m tests.daemon.shutdown_probe [--drain 30] [--compile 45]

Starts its own daemon (2 workers) on a temporary socket and cache, twice. Each time a client
asks for a compile that takes `--compile` seconds in a worker (debug_sleep_ms), and the
daemon is signalled once that compile runs and its workers have started: SIGTERM the first
time (it drains for `--drain` seconds), SIGKILL the second. Prints one JSON line per case:
what the client got, when, and how long after the signal the daemon's workers were gone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from trnsim import compiler
from trnsim.client.core.compile_client import DaemonCompileClient

from tests.daemon.helpers import (
    daemon_stats,
    job,
    past_start_up,
    start_daemon,
    worker_processes,
)


def probe(sig: signal.Signals, drain_s: float, compile_s: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="trn-probe-", dir="/tmp"))
    d = start_daemon(root, "--workers", "2", "--drain-timeout", str(drain_s))
    workers = [p.pid for p in worker_processes(d.pid())]
    client = DaemonCompileClient(d.address, auto_start=False)
    slow = job(70, debug_sleep_ms=int(compile_s * 1000))
    marks: dict[str, float] = {}
    guarded: list[int] = []  # workers past their start-up when signalled
    gone: dict[int, float] = {}  # worker -> seconds from the signal to its exit

    def signal_once_compiling() -> None:
        deadline = time.monotonic() + 30  # (the workers' start-up, on a loaded machine)
        while daemon_stats(d.address).in_flight == 0 or (
            time.monotonic() < deadline and not all(past_start_up(p) for p in workers)
        ):
            time.sleep(0.02)
        guarded[:] = [p for p in workers if past_start_up(p)]
        marks["signal"] = time.monotonic()
        d.proc.send_signal(sig)
        while len(gone) < len(workers):
            for p in workers:
                if p not in gone and gone(p):
                    gone[p] = time.monotonic() - marks["signal"]
            time.sleep(0.005)
        marks["workers_gone"] = time.monotonic()

    watcher = threading.Thread(target=signal_once_compiling)
    start = time.monotonic()
    watcher.start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = client.compile(slow)
    answered = time.monotonic()
    watcher.join(timeout=compile_s + 60)
    status = d.proc.wait(timeout=60)
    client.close()
    shutil.rmtree(root, ignore_errors=True)
    here = compiler.compile(slow.graph, slow.target, slow.options)
    return {
        "signal": sig.name,
        "drain_s": drain_s,
        "compile_s": compile_s,
        "client_got": compiled.tier.name,
        "client_warnings": [str(w.message) for w in caught],
        "in_process_compiles": client.local.compiles,
        "same_executable_as_in_process": (
            compiled.executable.SerializeToString() == here.SerializeToString()
        ),
        "asked_to_answer_s": round(answered - start, 2),
        "signal_to_answer_s": round(answered - marks["signal"], 2),
        "signal_to_workers_gone_s": round(marks["workers_gone"] - marks["signal"], 2),
        "workers": len(workers),
        "workers_started_up_at_signal": len(guarded),
        "each_worker_gone_s": sorted(round(t, 2) for t in gone.values()),
        "daemon_exit": status,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drain", type=float, default=30.0, help="the daemon's --drain-timeout")
    p.add_argument("--compile", type=float, default=45.0, help="seconds the compile takes")
    args = p.parse_args()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        print(json.dumps(probe(sig, args.drain, args.compile)), flush=True)


if __name__ == "__main__":
    main()
