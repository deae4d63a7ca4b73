"""The compile worker pool: processes running compiler/ (never torch), each fed by a
supervising thread. A worker that dies fails only its job (retried once) and is replaced;
a compile over the time limit is killed."""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from trnsim.daemon.inflight import InFlight, Job
from trnsim.daemon.worker import read_message, write_message
from trnsim.protos import compile_service_pb2 as svc

log = logging.getLogger(__name__)

Done = Callable[[Job, svc.CompileResult], None]


class _Process:
    """One worker process and its pipes."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trnsim.daemon.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )

    def compile(self, request: svc.CompileRequest, timeout: float) -> svc.CompileResult | str:
        """The result, or "died" / "timeout"."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            write_message(self.proc.stdin, request.SerializeToString())  # type: ignore[arg-type]
        except (BrokenPipeError, OSError):
            return "died"
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return "timeout"
        data = read_message(self.proc.stdout)  # type: ignore[arg-type]
        if data is None:
            return "died"
        return svc.CompileResult.FromString(data)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class WorkerPool:
    def __init__(self, size: int, inflight: InFlight, done: Done, timeout_s: float) -> None:
        self.size = size
        self.inflight = inflight
        self.done = done
        self.timeout_s = timeout_s
        self.restarts = 0
        self.busy = 0
        self._lock = threading.Lock()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._run, name=f"compile-worker-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        proc = _Process()
        try:
            while not self._stopping:
                job = self.inflight.next_job(timeout=0.5)
                if job is None:
                    continue
                with self._lock:
                    self.busy += 1
                try:
                    proc = self._compile(proc, job)
                finally:
                    with self._lock:
                        self.busy -= 1
        finally:
            proc.kill()

    def _compile(self, proc: _Process, job: Job) -> _Process:
        outcome = proc.compile(job.request, self.timeout_s)
        if isinstance(outcome, svc.CompileResult):
            self.done(job, outcome)
            return proc
        proc.kill()
        with self._lock:
            self.restarts += 1
        fresh = _Process()
        if outcome == "timeout":
            message = (
                f"the compile ran over the daemon's limit of {self.timeout_s:.0f} s and was killed"
            )
            self.done(
                job,
                svc.CompileResult(error=svc.CompileError(error_class=svc.TIMEOUT, message=message)),
            )
        elif job.attempts < 2:
            log.warning("compile worker died on %s; retrying once", job.key[:16])
            self.inflight.requeue(job)
        else:
            message = "the compile worker died twice on this graph (crash or out-of-memory kill)"
            self.done(
                job,
                svc.CompileResult(
                    error=svc.CompileError(error_class=svc.TRANSIENT, message=message)
                ),
            )
        return fresh

    def stop(self, wait_s: float = 5.0) -> None:
        self._stopping = True
        self.inflight.close()
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
