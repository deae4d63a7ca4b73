"""The in-flight table: one job per cache key, however many requests wait for it.

A request for a key already queued or compiling joins that job (its waiter count grows);
the queue hands workers the most urgent job (policy/priorities.py); a queued job whose
waiters all left is dropped without compiling, save a background job whose asker's stream
ended (the process exited before its fused graph was compiled): that one is compiled for the
shared cache, so that the executables compiled do not depend on when each process exits.
Waiters come only from open streams: a request still on its way through the I/O threads
when its stream closes, or when it is cancelled, never starts a compile nobody waits for.

A job leaves the table once its result is cached, so a request that missed the cache just
before that and reaches the table just after would start a second compile of the same key
(N ranks asking at once met this window a few times a run). Each lookup therefore takes a
ticket first (`ticket()`), and `submit` answers FINISHED when a job of that key finished
after the ticket: the caller looks in the cache again instead of compiling again.

Shutting down, every waiter is answered (cancel_all), and one that comes after is answered
at once.
"""

from __future__ import annotations

import enum
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from trnsim.policy import priorities
from trnsim.protos import compile_service_pb2 as svc

log = logging.getLogger(__name__)
# Hands one answer to the stream that asked for it (daemon/service.py). It is called on
# whichever thread has the answer (the event loop, an I/O thread, a worker's supervisor), so
# it only queues the answer for the stream's own loop.
Deliver = Callable[[svc.CompileResult], None]
# How many finished keys the table remembers for late requests (a request whose ticket is
# older than all of them looks in the cache again, to be safe).
RECENT_FINISHES = 4096


class Submitted(enum.Enum):
    """What became of a waiter handed to `InFlight.submit`."""

    QUEUED = enum.auto()  # it started a new job
    JOINED = enum.auto()  # it joined a job already in flight
    REFUSED = enum.auto()  # its stream closed or its request was cancelled: no answer owed
    FINISHED = enum.auto()  # a job of its key finished after its ticket: look in the cache


@dataclass(eq=False)
class Waiter:
    stream: int
    request_id: int
    priority: int
    deliver: Deliver
    joined: bool = False  # it joined a job already in flight (answered with tier JOINED)
    arrived_at: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class Job:
    key: str
    request: svc.CompileRequest
    enqueued_at: float = field(default_factory=time.monotonic)
    waiters: list[Waiter] = field(default_factory=list)
    attempts: int = 0
    running: bool = False
    started_at: float = 0.0  # when its (last) attempt started running
    # A background waiter's stream ended while it was queued: compiled even with no waiter.
    for_cache: bool = False

    @property
    def cache_key(self) -> str:
        """The executable's cache key (a job with test hooks has an in-flight key of its
        own, so that nobody joins a compile made to crash or stall)."""
        return self.key.split(":", 1)[0]

    def queued(self) -> priorities.QueuedJob:
        waiting = [w.priority for w in self.waiters]
        return priorities.QueuedJob(
            priorities.most_urgent(waiting) if waiting else priorities.BACKGROUND,
            len(self.waiters),
            self.enqueued_at,
            self.for_cache,
        )


class InFlight:
    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._cond = threading.Condition()
        self.closed = False
        self.joins = 0
        self.dropped = 0
        self.refused = 0  # waiters of closed streams or cancelled requests, never queued
        self._cancelled: str | None = None  # why every waiter is answered CANCELLED (cancel_all)
        self.relooked = 0  # requests sent back to the cache: their key finished meanwhile
        self._finishes = 0  # jobs finished so far: what a ticket counts
        self._recent: OrderedDict[str, int] = OrderedDict()  # key -> its last finish's number
        self._forgotten = 0  # the newest finish number dropped from _recent
        # open stream -> ids of its requests cancelled before they could be queued
        self._streams: dict[int, set[int]] = {}

    def open_stream(self, stream: int) -> None:
        with self._cond:
            self._streams[stream] = set()

    def close_stream(self, stream: int) -> None:
        """The stream ended: its waiters leave their jobs, and its requests still on their
        way are refused."""
        with self._cond:
            self._streams.pop(stream, None)
        self.withdraw(stream)

    def expect(self, stream: int, request_id: int) -> None:
        """A request is on its way (in the order the stream sent it): a cancel sent earlier
        for the same id no longer applies to it."""
        with self._cond:
            cancelled = self._streams.get(stream)
            if cancelled is not None:
                cancelled.discard(request_id)

    def ticket(self) -> int:
        """Taken before a cache lookup and handed to `submit`: finishes after it are seen."""
        with self._cond:
            return self._finishes

    def submit(
        self, key: str, request: svc.CompileRequest, waiter: Waiter, ticket: int | None = None
    ) -> Submitted:
        """Adds a waiter for key: it joins the job in flight, or starts one. The waiter of a
        closed stream or of a cancelled request is dropped (no answer is owed); after
        cancel_all(), a waiter is answered CANCELLED at once (REFUSED). With the ticket taken
        before the caller's cache lookup, a key whose job finished since then is not compiled
        again: FINISHED, the cache has its result (or its error)."""
        with self._cond:
            cancelled = self._streams.get(waiter.stream)
            if cancelled is None or waiter.request_id in cancelled:
                self.refused += 1
                return Submitted.REFUSED
            why = self._cancelled
            if why is None:
                return self._add(key, request, waiter, ticket)
        _deliver(Job(key, request), [waiter], _cancelled(why))
        return Submitted.REFUSED

    def _add(
        self, key: str, request: svc.CompileRequest, waiter: Waiter, ticket: int | None
    ) -> Submitted:
        """submit()'s waiter joins key's job, or starts one (called holding self._cond)."""
        job = self._jobs.get(key)
        if job is not None:
            waiter.joined = True
            job.waiters.append(waiter)
            self.joins += 1
            self._cond.notify_all()
            return Submitted.JOINED
        if ticket is not None and self._finished_since(key, ticket):
            self.relooked += 1
            return Submitted.FINISHED
        self._jobs[key] = Job(key, request, waiters=[waiter])
        self._cond.notify_all()
        return Submitted.QUEUED

    def _finished_since(self, key: str, ticket: int) -> bool:
        """Whether a job of key finished after `ticket` (or may have: a ticket older than
        what the table remembers). Called with the lock held."""
        return ticket < self._forgotten or self._recent.get(key, 0) > ticket

    def withdraw(self, stream: int, request_id: int | None = None) -> None:
        """A stream closed (or cancelled one request): its waiters leave their jobs. A
        background job left by a closed stream stays, for the shared cache."""
        with self._cond:
            cancelled = self._streams.get(stream)
            if request_id is not None and cancelled is not None:
                cancelled.add(request_id)  # (in case it is still on its way)
            for key, job in list(self._jobs.items()):
                leaving = [
                    w
                    for w in job.waiters
                    if w.stream == stream and (request_id is None or w.request_id == request_id)
                ]
                if not leaving:
                    continue
                job.waiters = [w for w in job.waiters if w not in leaving]
                if request_id is None and any(w.priority == priorities.BACKGROUND for w in leaving):
                    job.for_cache = True
                if not job.waiters and not job.running and not job.for_cache:
                    del self._jobs[key]
                    self.dropped += 1

    def next_job(
        self, timeout: float | None = None, background_slots: int | None = None
    ) -> Job | None:
        """Blocks until a runnable job is queued (or the table closes); marks it running.
        With background_slots, a background job starts only while fewer than that many run
        (priorities.may_start: a worker stays free for blocking compiles)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        slots = sys.maxsize if background_slots is None else background_slots
        with self._cond:
            while not self.closed:
                background = sum(
                    1
                    for j in self._jobs.values()
                    if j.running and j.queued().priority == priorities.BACKGROUND
                )
                queued = [
                    j
                    for j in self._jobs.values()
                    if not j.running and priorities.may_start(j.queued(), background, slots)
                ]
                if queued:
                    job = min(queued, key=lambda j: priorities.rank(j.queued()))
                    job.running = True
                    job.attempts += 1
                    job.started_at = time.monotonic()
                    return job
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return None

    def requeue(self, job: Job) -> None:
        with self._cond:
            job.running = False
            if not job.waiters and not job.for_cache:
                self._jobs.pop(job.key, None)
                self.dropped += 1
            self._cond.notify_all()

    def finish(self, job: Job, result: svc.CompileResult) -> int:
        """Delivers the result to every waiter (each with its own request id). Called after
        the result is cached: a request that missed the cache before is sent back to it."""
        with self._cond:
            self._jobs.pop(job.key, None)
            waiters = list(job.waiters)
            self._finishes += 1
            self._recent[job.key] = self._finishes
            self._recent.move_to_end(job.key)
            while len(self._recent) > RECENT_FINISHES:
                _, self._forgotten = self._recent.popitem(last=False)
        _deliver(job, waiters, result)
        return len(waiters)

    def cancel_queued(self, message: str) -> int:
        """Draining: queued jobs are handed back to their waiters (who compile themselves)."""
        with self._cond:
            queued = [j for j in self._jobs.values() if not j.running]
            for j in queued:
                del self._jobs[j.key]
        for j in queued:
            self.finish(j, _cancelled(message))
        return len(queued)

    def cancel_all(self, message: str) -> int:
        """Shutting down: every waiter, of a queued or a running job, is answered CANCELLED
        now (the number answered), and every later one at once. A running compile that ends
        after answers nobody: each waiter gets one answer."""
        with self._cond:
            self._cancelled = message
            jobs = list(self._jobs.values())
            self._jobs.clear()
            handed = [(j, j.waiters) for j in jobs]
            for j in jobs:
                j.waiters = []
            self._cond.notify_all()
        for j, waiters in handed:
            _deliver(j, waiters, _cancelled(message))
        return sum(len(waiters) for _, waiters in handed)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def counts(self) -> tuple[int, int, int]:
        """(queued, running, waiters)."""
        with self._cond:
            queued = sum(1 for j in self._jobs.values() if not j.running)
            running = sum(1 for j in self._jobs.values() if j.running)
            waiters = sum(len(j.waiters) for j in self._jobs.values())
        return queued, running, waiters


def _deliver(job: Job, waiters: list[Waiter], result: svc.CompileResult) -> None:
    """Hands each waiter its copy of a job's result, under its own request id."""
    now = time.monotonic()
    for w in waiters:
        out = svc.CompileResult()
        out.CopyFrom(result)
        out.id = w.request_id
        out.modelled_seconds_waited = result.modelled_compile_seconds * _share(job, w, now)
        if w.joined and out.WhichOneof("outcome") == "executable":
            out.tier = svc.JOINED
        try:
            w.deliver(out)
        except Exception:  # (a closed stream): the other waiters still get theirs
            log.exception("answering request %d failed", w.request_id)


def _cancelled(message: str) -> svc.CompileResult:
    return svc.CompileResult(error=svc.CompileError(error_class=svc.CANCELLED, message=message))


def _share(job: Job, waiter: Waiter, now: float) -> float:
    """The part of the compile a waiter waited for: all of it if it came before the compile
    started, else the part still to run when it came (by the compile's own clock)."""
    if waiter.arrived_at <= job.started_at:
        return 1.0
    ran = now - job.started_at
    return max(0.0, min(1.0, (now - waiter.arrived_at) / ran)) if ran > 0 else 0.0
