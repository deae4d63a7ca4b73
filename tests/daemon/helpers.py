"""Starting real daemons and building compile requests for the daemon tests."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil
from trnsim import compiler
from trnsim.client.core.compile_client import CompileJob, DaemonCompileClient
from trnsim.compiler.graph import GraphBuilder, TensorType, to_proto
from trnsim.daemon import launcher
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc
from trnsim.protos import executable_pb2


@dataclass
class DaemonProcess:
    address: str
    cache_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)

    def pid(self) -> int:
        return self.proc.pid


def start_daemon(
    root: Path,
    *args: str,
    cache_dir: Path | None = None,
    env: dict[str, str] | None = None,
    user: tuple[int, int] | None = None,
) -> DaemonProcess:
    """A daemon on root/run/c.sock (run as `user`, (uid, gid), when given)."""
    sock_dir = root / "run"
    address = f"unix:{sock_dir / 'c.sock'}"
    cache = cache_dir or root / "cache"
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"daemon-{time.monotonic_ns()}.log"
    cmd = [
        sys.executable,
        "-m",
        "trnsim.daemon",
        "--address",
        address,
        "--cache-dir",
        str(cache),
        *args,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=out,
            env={**os.environ, **(env or {})},
            user=user[0] if user else None,
            group=user[1] if user else None,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if launcher.get_info(address, timeout=0.5) is not None:
            return DaemonProcess(address, cache, proc, log)
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited {proc.returncode}: {log.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"daemon did not answer: {log.read_text()}")


def pythonpath(first: Path) -> str:
    """PYTHONPATH for a child process: `first` (the repository, for `tests.*`), then the
    caller's own (a checkout tested in place of the installed package stays in place)."""
    return os.pathsep.join(p for p in (str(first), os.environ.get("PYTHONPATH", "")) if p)


def answers(address: str, *requests: svc.CompileRequest) -> list[svc.CompileResult]:
    """One answer per request, over one client stream (the test's deadline catches a
    missing one)."""
    client = DaemonCompileClient(address, auto_start=False)
    try:
        futures = [client.submit(r) for r in requests]
        return [f.result(timeout=120) for f in futures]
    finally:
        client.close()


def daemon_stats(address: str) -> svc.StatsResponse:
    with grpc.insecure_channel(address) as ch:
        return svc_grpc.CompileServiceStub(ch).Stats(svc.StatsRequest(), timeout=30)


def graph(i: int, size: int = 64):
    """A small distinct graph per i."""
    b = GraphBuilder(f"g{i}")
    x = b.input([size, size + i])
    w = b.input([size + i, size])
    y = b.op("aten::mm.default", x, w, out=TensorType.contiguous([size, size]))
    return b.build(b.op("aten::relu.default", y, out=TensorType.contiguous([size, size])))


def job(i: int, **options: object) -> CompileJob:
    """request(i) as the compile client takes it."""
    r = request(i, **options)
    return CompileJob(r.graph, r.target, r.options)


def request(i: int, **options: object) -> svc.CompileRequest:
    return svc.CompileRequest(
        priority=svc.BLOCKING,
        graph=to_proto(graph(i)),
        target="trn2",
        options=executable_pb2.CompileOptions(**options),  # type: ignore[arg-type]
        compiler_version=compiler.compiler_version(),
        format_version=compiler.FORMAT_VERSION,
    )


def cache_rows(cache_dir: Path, prefix: str = "exe:") -> list[tuple[int, str, bytes]]:
    """(rowid, key, value) of the entries the daemon's disk tier holds in its database whose
    key starts with `prefix`: executables by default ("": every row, the key parts too)."""
    with sqlite3.connect(cache_dir / "executables" / "cache.db") as db:
        rows = db.execute("SELECT rowid, key, value FROM Cache ORDER BY rowid")
        return [r for r in rows if isinstance(r[1], str) and r[1].startswith(prefix)]


def set_row(cache_dir: Path, rowid: int, **columns: object) -> None:
    """Rewrites columns of one row behind the daemon's back (corruption, planted rows)."""
    names = ", ".join(f"{k} = ?" for k in columns)
    with sqlite3.connect(cache_dir / "executables" / "cache.db") as db:
        db.execute(f"UPDATE Cache SET {names} WHERE rowid = ?", (*columns.values(), rowid))


def worker_processes(parent: int) -> list[psutil.Process]:
    """The live compile workers among a process's children (zombies and the gone skipped)."""
    found = []
    for p in psutil.Process(parent).children():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if "trnsim.daemon.worker" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def run_json(code: str, env: dict[str, str], *args: str) -> Any:
    """Runs `python -c code args...` in a process of its own; its last line of output, JSON."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def gone(pid: int) -> bool:
    """Exited (a zombie no one reaped yet counts: it runs nothing)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def past_start_up(pid: int) -> bool:
    """A worker that runs its parent watch (worker.die_with is done: its start-up is over)."""
    try:
        return psutil.Process(pid).num_threads() >= 2
    except psutil.Error:
        return False
