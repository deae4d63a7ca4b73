"""What trnsim tells the user while they wait: the `trnsim` logger, on stderr.

A blocking compile (an eager op's first sight, a compiled region, a shape bucket) that keeps
the program waiting over PROGRESS_AFTER_S of real time prints what is compiling, how many
other compiles are under way, and, when it is done, how long it took and its modelled
compile time. Under torchrun only local rank 0 prints: once per host, not once per rank.

NEURON_LOG_LEVEL (debug, info: the default, warning, error, off) sets the logger's level;
a program that configures the `trnsim` logger itself keeps its own handlers.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from trnsim.client.core import env

PROGRESS_AFTER_S = 2.0  # real seconds a blocking compile may take before it is announced
REPEAT_EVERY_S = 15.0  # then a line this often while it lasts

log = logging.getLogger("trnsim")
_configured: list[bool] = []


def configure() -> None:
    """Once: the level from NEURON_LOG_LEVEL, and a stderr handler unless the program gave
    the `trnsim` logger one of its own."""
    if _configured:
        return
    level = env.log_level()  # (a bad value raises before anything is set up)
    _configured.append(True)
    log.setLevel(logging.CRITICAL + 1 if level == "off" else getattr(logging, level.upper()))
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("trnsim: %(message)s"))
        log.addHandler(handler)
        log.propagate = False


class _Wait:
    def __init__(self, what: str, others: Callable[[], int]) -> None:
        self.what, self.others = what, others
        self.start = time.monotonic()
        self.announced_at: float | None = None


_waits: dict[int, _Wait] = {}  # thread id -> its blocking compile (one at a time per thread)
_watcher: list[threading.Thread] = []
WATCH_EVERY_S = 0.25


def _watch() -> None:
    """One thread for the process: announces the blocking compiles that last."""
    while True:
        time.sleep(WATCH_EVERY_S)
        now = time.monotonic()
        for wait in list(_waits.values()):
            due = (
                PROGRESS_AFTER_S
                if wait.announced_at is None
                else wait.announced_at - wait.start + REPEAT_EVERY_S
            )
            if now - wait.start >= due:
                wait.announced_at = now
                more = wait.others()
                tail = f"; {more} more compiling in the background" if more else ""
                log.info("compiling %s: waiting %.0f s so far%s", wait.what, now - wait.start, tail)


@contextmanager
def compile_wait(what: str, others: Callable[[], int]) -> Iterator[Callable[[float], None]]:
    """Around a blocking compile: announces it if it lasts. Yields done(modelled_seconds),
    to be called with the executable's modelled compile time once it has arrived."""
    configure()
    if not env.announces_progress() or not log.isEnabledFor(logging.INFO):
        yield lambda modelled: None
        return
    if not _watcher:
        _watcher.append(threading.Thread(target=_watch, name="trnsim-progress", daemon=True))
        _watcher[0].start()
    wait = _Wait(what, others)
    me = threading.get_ident()
    _waits[me] = wait
    result: list[float] = []
    try:
        yield result.append
    finally:
        _waits.pop(me, None)
        if wait.announced_at is not None:
            modelled = f", modelled {result[0]:.1f} s on the chip's compiler" if result else ""
            log.info("compiled %s in %.1f s%s", what, time.monotonic() - wait.start, modelled)
