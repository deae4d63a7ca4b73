"""The compile worker pool: processes running compiler/ (never torch), each fed by a
supervising thread. A worker that dies fails only its job (retried once) and is replaced;
a compile over the time limit is killed. Workers never outlive the daemon: stopping the pool
ends them, a daemon's death ends them (worker.die_with), and a daemon starting reaps those
an earlier daemon left (reap_orphans)."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import psutil
from google.protobuf.message import DecodeError
from trnsim.daemon.inflight import InFlight, Job
from trnsim.daemon.worker import PARENT_OPTION, read_message, write_message
from trnsim.policy import priorities
from trnsim.protos import compile_service_pb2 as svc

log = logging.getLogger(__name__)

# Hands a job's result (or the daemon's error for it) to the service, on the thread that
# supervised the compile: the service caches it and answers the job's waiters.
Done = Callable[[Job, svc.CompileResult], None]
WORKER_MODULE = "trnsim.daemon.worker"
STOP_GRACE_S = 1.0  # a stopped worker's time to exit on SIGTERM before SIGKILL
STOPPING = "the compile daemon is shutting down"


class _Process:
    """One worker process and its pipes. Started by the thread that supervises it, which
    outlives it: Linux sends the parent-death signal (worker.die_with) when the thread
    that forked a process ends, not only the whole daemon."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE, PARENT_OPTION, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def compile(self, request: svc.CompileRequest, timeout: float) -> svc.CompileResult | str:
        """The result, or "died" / "timeout"."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            write_message(self.proc.stdin, request.SerializeToString())  # type: ignore[arg-type]
        except OSError:  # (BrokenPipeError: it died before or while reading)
            return "died"
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return "timeout"
        try:
            data = read_message(self.proc.stdout)  # type: ignore[arg-type]
            return "died" if data is None else svc.CompileResult.FromString(data)
        except (OSError, DecodeError):
            return "died"  # a worker that writes garbage is as good as dead

    def terminate(self) -> None:
        """Asks it to exit (SIGTERM): kill() after a grace makes sure."""
        with contextlib.suppress(OSError):
            if self.proc.poll() is None:
                self.proc.terminate()

    def kill(self) -> None:
        """Gone for good, whatever state it and its pipes are in (a dead reader makes
        closing stdin raise BrokenPipeError as it flushes)."""
        with contextlib.suppress(OSError):
            if self.proc.poll() is None:
                self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class WorkerPool:
    """`size` threads, each supervising one worker process: a worker that dies, idle or
    busy, is noticed and replaced (counted in `restarts`); a thread never dies with its job
    unanswered, whatever fails."""

    def __init__(self, size: int, inflight: InFlight, done: Done, timeout_s: float) -> None:
        self.size = size
        self.inflight = inflight
        self.done = done
        self.timeout_s = timeout_s
        self.restarts = 0
        self.busy = 0
        self._lock = threading.Lock()
        self._stopping = False
        self._procs: set[_Process] = set()  # every live worker, for stop() to end
        self._threads = [
            threading.Thread(target=self._run, name=f"compile-worker-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def alive(self) -> int:
        """Supervising threads still running (each keeps one worker process)."""
        return sum(t.is_alive() for t in self._threads)

    def _run(self) -> None:
        proc = self._spawn()
        try:
            while not self._stopping:
                if proc is None or not proc.alive():  # (an idle worker killed by the OOM killer)
                    proc = self._replace(proc, "an idle compile worker died")
                    continue
                job = self.inflight.next_job(
                    timeout=0.5, background_slots=priorities.background_slots(self.size)
                )
                if job is None:
                    continue
                proc = self._run_job(proc, job)
        finally:
            if proc is not None:
                self._end(proc)

    def _run_job(self, proc: _Process, job: Job) -> _Process | None:
        with self._lock:
            self.busy += 1
        try:
            return self._compile(proc, job)
        except Exception as e:
            log.exception("compiling %s failed inside the daemon", job.key[:16])
            message = f"internal error of the compile daemon ({type(e).__name__}: {e})"
            self.done(job, _error(svc.TRANSIENT, message))
            return self._replace(proc, "after an internal error")
        finally:
            with self._lock:
                self.busy -= 1

    def _spawn(self) -> _Process | None:
        """A new worker, registered for stop() to end; none once the pool is stopping."""
        with self._lock:  # (stop() sees every worker started before it set _stopping)
            if self._stopping:
                return None
            try:
                proc = _Process()
            except OSError as e:  # (fork failed, out of descriptors): try again shortly
                log.error("could not start a compile worker: %s", e)
            else:
                self._procs.add(proc)
                return proc
        time.sleep(1.0)
        return None

    def _end(self, proc: _Process) -> None:
        proc.kill()
        with self._lock:
            self._procs.discard(proc)

    def _replace(self, proc: _Process | None, why: str) -> _Process | None:
        if proc is not None:
            self._end(proc)
            with self._lock:
                self.restarts += 1
            log.warning("%s; starting another", why)
        return self._spawn()

    def _compile(self, proc: _Process, job: Job) -> _Process | None:
        outcome = proc.compile(job.request, self.timeout_s)
        if isinstance(outcome, svc.CompileResult):
            self.done(job, outcome)
            return proc
        if self._stopping:  # ended by stop(): no retry, no new worker
            self._end(proc)
            self.done(job, _error(svc.CANCELLED, STOPPING))
            return None
        fresh = self._replace(proc, f"a compile worker {outcome} on {job.key[:16]}")
        if outcome == "timeout":
            message = (
                f"the compile ran over the daemon's limit of {self.timeout_s:.0f} s and was killed"
            )
            self.done(job, _error(svc.TIMEOUT, message))
        elif job.attempts < 2:
            self.inflight.requeue(job)
        else:
            message = "the compile worker died twice on this graph (crash or out-of-memory kill)"
            self.done(job, _error(svc.TRANSIENT, message))
        return fresh

    def stop(self, wait_s: float = 5.0) -> None:
        """Ends every worker, mid-compile or idle: SIGTERM, then SIGKILL for any still there
        after STOP_GRACE_S; no worker is started after. The service answers the jobs' waiters
        first (CompileService.drain); a job still running is answered CANCELLED. Again: a
        no-op."""
        with self._lock:
            self._stopping = True
            procs = list(self._procs)
        self.inflight.close()
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.proc.wait(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            self._end(proc)
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


def reap_orphans() -> list[int]:
    """Kills the compile workers of this user whose daemon is gone (the pids killed): a
    worker started with `--parent P` whose parent is no longer P was orphaned (a process's
    parent changes only when it dies). Such a worker would finish its compile for nobody.
    Only this user's processes running this module with that option are considered."""
    orphans = [p for p in psutil.process_iter(["uids", "cmdline", "ppid"]) if _orphan(p)]
    for p in orphans:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(orphans, timeout=STOP_GRACE_S)
    return [p.pid for p in orphans]


def _orphan(p: psutil.Process) -> bool:
    info = p.info
    cmdline, uids = info.get("cmdline") or [], info.get("uids")
    if uids is None or uids.real != os.getuid() or p.pid == os.getpid():
        return False
    try:
        at = cmdline.index(WORKER_MODULE)
        parent = int(cmdline[cmdline.index(PARENT_OPTION, at) + 1])
    except (ValueError, IndexError):
        return False  # not a worker, or not one started with its daemon's pid
    return at > 0 and cmdline[at - 1] == "-m" and info.get("ppid") != parent


def _error(error_class: svc.ErrorClass, message: str) -> svc.CompileResult:
    return svc.CompileResult(error=svc.CompileError(error_class=error_class, message=message))
