"""Telling a busy compile daemon from a hung one, and when to try a daemon again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

RETRY_MAX_S = 60.0  # the longest a client goes without asking an unreachable daemon again


class Backoff:
    """When to ask a daemon that could not be reached again: `first_s` after the first
    failed try, twice as long after each further one, at most RETRY_MAX_S; never after a
    refusal that only a person can fix (an untrusted socket, another compiler version).
    The time is set when a try has failed, so the try's own wait is not counted in it."""

    def __init__(self) -> None:
        self.retry_at = 0.0  # time.monotonic() of the next try
        self.failures = 0  # failed tries since the daemon last answered

    def due(self) -> bool:
        return time.monotonic() >= self.retry_at

    def failed(self, first_s: float) -> float:
        """Records a failed try; the seconds until the next one."""
        delay = min(first_s * 2.0**self.failures, RETRY_MAX_S)
        self.failures += 1
        self.retry_at = time.monotonic() + delay
        return delay

    def never(self) -> None:
        self.retry_at = float("inf")

    def answered(self) -> None:
        self.failures = 0
        self.retry_at = 0.0


# A daemon whose process runs but has not answered for this long is wedged, not loaded.
WEDGED_S = 10.0


class Watchdog:
    """Watches one stream to the daemon: while a request waits on it and the daemon has sent
    nothing for `deadline_s`, it calls `check`, which asks the daemon's gRPC health service
    with that deadline (False: no answer). The health check is answered on the daemon's
    event loop, which a daemon busy with a compile of minutes keeps serving (its workers
    compile). When it goes unanswered, `stopped` tells a stopped daemon process (SIGSTOP:
    `hung` at once) from a running one that is only slow to answer (64 clients on 2 cores
    kept health checks waiting over 1 s): that one is asked again, and taken for hung
    (its event loop wedged) only after `wedged_s` of silence. `hung` is called once, with
    the reason. The watchdog sleeps while nothing waits."""

    def __init__(
        self,
        deadline_s: float,
        check: Callable[[], bool],
        waiting: Callable[[], bool],
        hung: Callable[[str], None],
        stopped: Callable[[], bool] = lambda: True,
        wedged_s: float = WEDGED_S,
    ) -> None:
        self.deadline_s = deadline_s
        self.wedged_s = max(wedged_s, deadline_s)
        self._stopped_process = stopped
        self.heard_at = time.monotonic()  # when the daemon last showed it is alive
        self._check = check
        self._waiting = waiting
        self._hung = hung
        self._wake = threading.Event()  # set: something may be waiting
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="trnsim-daemon-health", daemon=True)
        self._thread.start()

    def heard(self) -> None:
        """The daemon sent something: it is alive now."""
        self.heard_at = time.monotonic()

    def request_sent(self) -> None:
        """A request now waits: silence from here on counts (an idle stream's does not)."""
        if not self._wake.is_set():
            self.heard_at = max(self.heard_at, time.monotonic())
            self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait()
            self._wake.clear()
            if self._stopped:
                return
            if not self._waiting():
                continue  # (a request sent after the clear set the event again)
            self._wake.set()
            silence = time.monotonic() - self.heard_at
            if silence < self.deadline_s:
                time.sleep(self.deadline_s - silence)
            elif not self._answers():
                why = self._why_hung(time.monotonic() - self.heard_at)
                if why and not self._stopped:
                    self._hung(why)
                    return

    def _why_hung(self, silence: float) -> str:
        """Why the silent daemon counts as hung now, or "" (slow: ask it again)."""
        if self._stopped_process():
            return (
                f"the compile daemon's process is stopped and did not answer a health check "
                f"within {self.deadline_s:g} s"
            )
        if silence >= self.wedged_s:
            return f"the compile daemon runs but has not answered for {silence:.0f} s (wedged?)"
        return ""

    def _answers(self) -> bool:
        """Whether the daemon answers a health check within the deadline. Only silence
        means hung; a broken connection is the stream reader's to notice."""
        if not self._check():
            return False
        self.heard()
        return True
