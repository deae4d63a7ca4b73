"""Stopping a daemon mid-compile: every waiter gets an answer, no worker outlives its daemon,
and a daemon starting reaps the workers an earlier one left (real daemons and workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import psutil
from trnsim import compiler
from trnsim.client.core.compile_client import DaemonCompileClient, Tier
from trnsim.protos import compile_service_pb2 as svc

from .helpers import (
    daemon_stats,
    gone,
    job,
    past_start_up,
    request,
    start_daemon,
    worker_processes,
)

LONG_MS = 60_000  # a compile far longer than the drain (debug_sleep_ms: not in the key)
GONE_WITHIN_S = 2.0


def _until(condition, what: str, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f} s for {what}"
        time.sleep(0.02)


def _seconds_until_gone(pids: list[int], timeout_s: float = 30.0) -> float:
    start = time.monotonic()
    _until(lambda: all(gone(p) for p in pids), f"workers {pids} to exit", timeout_s)
    return time.monotonic() - start


def test_a_compile_longer_than_the_drain_is_answered_and_compiled_in_process(short_tmp):
    d = start_daemon(short_tmp, "--workers", "2", "--drain-timeout", "1")
    workers = [p.pid for p in worker_processes(d.pid())]
    assert len(workers) == 2
    client = DaemonCompileClient(d.address, auto_start=False)
    slow = job(60, debug_sleep_ms=LONG_MS)
    sent: list[float] = []

    def stop_once_compiling() -> None:
        _until(lambda: daemon_stats(d.address).in_flight == 1, "the compile to start")
        sent.append(time.monotonic())
        d.proc.send_signal(signal.SIGTERM)

    stopper = threading.Thread(target=stop_once_compiling)
    stopper.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = client.compile(slow)
        answered = time.monotonic()
        stopper.join(timeout=30)
        _seconds_until_gone(workers)
        workers_gone = time.monotonic()
        assert d.proc.wait(timeout=30) == 0
    finally:
        client.close()
        d.stop(signal.SIGKILL)
    assert answered - sent[0] < 1 + 3, "answered after the 1 s drain, not after the compile"
    assert compiled.tier == Tier.IN_PROCESS and client.local.compiles == 1, "compiled here, once"
    here = compiler.compile(slow.graph, slow.target, slow.options)
    assert compiled.executable.cache_key == slow.key
    assert compiled.executable.SerializeToString() == here.SerializeToString()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "shutting down" in messages[0], messages
    assert "UNAVAILABLE" not in messages[0] and "went away" not in messages[0]
    assert workers_gone - sent[0] < 1 + GONE_WITHIN_S, "gone right after the 1 s drain"
    assert "answered CANCELLED" in d.log.read_text()


def test_waiters_get_their_answer_on_the_stream_not_the_server_cut(short_tmp):
    """Two requests for the same long compile (a join) and one queued behind it (one
    worker): each gets a CompileResult, CANCELLED, and the stream ends cleanly after."""
    d = start_daemon(short_tmp, "--workers", "1", "--drain-timeout", "1")
    client = DaemonCompileClient(d.address, auto_start=False)
    try:
        futures = [client.submit(request(61, debug_sleep_ms=LONG_MS)) for _ in range(2)]
        _until(lambda: daemon_stats(d.address).in_flight == 1, "the compile to start")
        futures.append(client.submit(request(62)))
        _until(lambda: daemon_stats(d.address).queue_depth == 1, "the second job queued")
        d.proc.send_signal(signal.SIGTERM)
        results = [f.result(timeout=30) for f in futures]
        assert d.proc.wait(timeout=30) == 0
    finally:
        client.close()
        d.stop(signal.SIGKILL)
    assert [r.error.error_class for r in results] == [svc.CANCELLED] * 3
    assert all("shutting down" in r.error.message for r in results)


def test_an_idle_daemons_workers_exit_with_it_on_sigterm(short_tmp):
    d = start_daemon(short_tmp, "--workers", "2")
    workers = [p.pid for p in worker_processes(d.pid())]
    d.proc.send_signal(signal.SIGTERM)
    assert _seconds_until_gone(workers) < GONE_WITHIN_S
    assert d.proc.wait(timeout=30) == 0


def test_workers_die_with_a_daemon_killed_mid_compile(short_tmp):
    """Both workers compiling (so both are past their start-up: one still starting when its
    daemon dies exits once started, test_a_worker_whose_daemon_is_gone_...)."""
    d = start_daemon(short_tmp, "--workers", "2")
    workers = [p.pid for p in worker_processes(d.pid())]
    client = DaemonCompileClient(d.address, auto_start=False)
    try:
        for i in (63, 64):
            client.submit(request(i, debug_sleep_ms=LONG_MS))
        _until(lambda: daemon_stats(d.address).in_flight == 2, "both compiles to start")
        _until(lambda: all(past_start_up(p) for p in workers), "the workers' parent watch")
        d.proc.send_signal(signal.SIGKILL)
        assert _seconds_until_gone(workers) < GONE_WITHIN_S, "no worker outlives its daemon"
    finally:
        client.close()
        d.stop(signal.SIGKILL)


# A worker of an installation without the parent-death guard: it runs on after its daemon,
# as a compile would (its command line is a worker's: `-m trnsim.daemon.worker --parent P`).
_UNGUARDED_WORKER = "import time\ntime.sleep(120)\n"


def _unguarded_worker_env(root: Path) -> dict[str, str]:
    package = root / "old" / "trnsim" / "daemon"
    package.mkdir(parents=True, exist_ok=True)
    for init in (package.parent / "__init__.py", package / "__init__.py"):
        init.touch()
    (package / "worker.py").write_text(_UNGUARDED_WORKER)
    return {**os.environ, "PYTHONPATH": str(root / "old")}


def _plant_orphan(root: Path) -> int:
    """An unguarded worker started by a process that exits at once (as a daemon killed
    before its worker's guard could act): its parent is no longer the one on its command
    line. Its pid."""
    launcher = textwrap.dedent(
        """
        import os, subprocess, sys
        argv = [sys.executable, "-m", "trnsim.daemon.worker", "--parent", str(os.getpid())]
        quiet = subprocess.DEVNULL  # (a pipe held open would keep subprocess.run waiting)
        kept = dict(stdin=quiet, stdout=quiet, stderr=quiet, start_new_session=True)
        print(subprocess.Popen(argv, **kept).pid)
        """
    )
    env = _unguarded_worker_env(root)
    out = subprocess.run(
        [sys.executable, "-c", launcher], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_a_starting_daemon_reaps_orphaned_workers_and_only_those(short_tmp):
    orphan = _plant_orphan(short_tmp)
    argv = [sys.executable, "-m", "trnsim.daemon.worker", "--parent", str(os.getpid())]
    # an unguarded worker whose daemon (this test) still runs: not an orphan
    adopted = subprocess.Popen(argv, env=_unguarded_worker_env(short_tmp))
    try:
        cmdline = " ".join(psutil.Process(orphan).cmdline())
        assert "-m trnsim.daemon.worker --parent" in cmdline
        assert psutil.Process(orphan).ppid() != os.getpid()
        d = start_daemon(short_tmp, "--workers", "1")
        try:
            assert gone(orphan), "reaped before the daemon answered"
            assert adopted.poll() is None, "a worker whose daemon lives is not an orphan"
            said = [ln for ln in d.log.read_text().splitlines() if "left by a daemon" in ln]
            assert len(said) == 1 and str(orphan) in said[0].split("pids ")[1].split(", ")
            assert len(worker_processes(d.pid())) == 1, "its own worker, beside nothing"
        finally:
            d.stop()
    finally:
        if not gone(orphan):
            os.kill(orphan, signal.SIGKILL)
        adopted.kill()
        adopted.wait()


def test_a_worker_whose_daemon_is_gone_before_it_starts_exits_at_once():
    """The race the parent-death signal cannot cover: a worker started for a daemon that
    died first (here: a parent other than the one named) exits at once, its stdin open."""
    argv = [sys.executable, "-m", "trnsim.daemon.worker", "--parent", str(os.getppid())]
    worker = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert worker.wait(timeout=30) == 0
    finally:
        worker.kill()
        worker.wait()
        for pipe in (worker.stdin, worker.stdout):
            assert pipe is not None
            pipe.close()
