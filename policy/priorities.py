"""The order in which the daemon compiles queued jobs (shared by daemon and clients).

Blocking requests (a step waits) before background ones; then the job more processes are
waiting for; then the oldest. A job nobody waits for any more is not compiled at all, save a
background one whose asking process ended while it was queued: it is compiled for the shared
cache, after every job someone waits for (the next run, or a rank still to meet the graph,
fetches it; so N ranks compile the same executables as one, however their exits fall).
Background jobs never hold every worker: one is kept for the blocking compiles a step may
ask for at any moment (a background compile of a fused graph can take tens of seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCKING = 1  # matches trnsim.service.Priority
BACKGROUND = 2


@dataclass(frozen=True)
class QueuedJob:
    priority: int  # BLOCKING or BACKGROUND (the most urgent of its waiters)
    waiters: int
    enqueued_at: float  # seconds, any monotonic clock
    for_cache: bool = False  # a background job whose asker ended: compiled with no waiter


def rank(job: QueuedJob) -> tuple[int, int, float]:
    """Sort key: smaller runs first."""
    urgency = 0 if job.priority == BLOCKING else 1
    return (urgency, -job.waiters, job.enqueued_at)


def runnable(job: QueuedJob) -> bool:
    return job.waiters > 0 or job.for_cache


def most_urgent(priorities: list[int]) -> int:
    """The job's priority when several waiters asked with different ones."""
    return BLOCKING if BLOCKING in priorities or not priorities else BACKGROUND


def background_slots(workers: int) -> int:
    """How many workers may run background jobs at once: all but one (one, with one)."""
    return max(1, workers - 1)


def may_start(job: QueuedJob, background_running: int, slots: int) -> bool:
    """Whether a queued job may start now, with `background_running` background jobs
    running and `slots` workers allowed to run them."""
    return runnable(job) and (job.priority == BLOCKING or background_running < slots)
