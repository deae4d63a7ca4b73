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

from trnsim.client import env

PROGRESS_AFTER_S = 2.0  # real seconds a blocking compile may take before it is announced
REPEAT_EVERY_S = 15.0  # then a line this often while it lasts

log = logging.getLogger("trnsim")
_configured: list[bool] = []


def configure() -> None:
    """Once: the level from NEURON_LOG_LEVEL, and a stderr handler unless the program gave
    the `trnsim` logger one of its own."""
    if _configured:
        return
    _configured.append(True)
    level = env.log_level()
    log.setLevel(logging.CRITICAL + 1 if level == "off" else getattr(logging, level.upper()))
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("trnsim: %(message)s"))
        log.addHandler(handler)
        log.propagate = False


@contextmanager
def compile_wait(what: str, others: Callable[[], int]) -> Iterator[Callable[[float], None]]:
    """Around a blocking compile: announces it if it lasts. Yields done(modelled_seconds),
    to be called with the executable's modelled compile time once it has arrived."""
    configure()
    if not env.announces_progress() or not log.isEnabledFor(logging.INFO):
        yield lambda modelled: None
        return
    start = time.monotonic()
    finished = threading.Event()
    announced: list[bool] = []

    def announce() -> None:
        waited = PROGRESS_AFTER_S
        while not finished.wait(waited if not announced else REPEAT_EVERY_S):
            elapsed = time.monotonic() - start
            more = others()
            tail = f"; {more} more compiling in the background" if more else ""
            log.info("compiling %s: waiting %.0f s so far%s", what, elapsed, tail)
            announced.append(True)

    thread = threading.Thread(target=announce, name="trnsim-progress", daemon=True)
    thread.start()
    result: list[float] = []
    try:
        yield result.append
    finally:
        finished.set()
        thread.join()
        if announced:
            modelled = f", modelled {result[0]:.1f} s on the chip's compiler" if result else ""
            log.info("compiled %s in %.1f s%s", what, time.monotonic() - start, modelled)
