"""A blocking compile that keeps the user waiting says so (client/core/progress.py)."""

from __future__ import annotations

import logging
import time

import pytest
from trnsim.client.core import progress


@pytest.fixture
def lines(monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 0.2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    progress.configure()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep()
    progress.log.addHandler(handler)
    yield seen
    progress.log.removeHandler(handler)


def test_a_long_blocking_compile_is_announced_then_its_end(lines):
    with progress.compile_wait("a compiled graph of 36 ops (-O2)", lambda: 3) as done:
        time.sleep(0.5)
        done(12.5)
    assert lines[0].startswith("compiling a compiled graph of 36 ops (-O2): waiting 0 s so far")
    assert "3 more compiling in the background" in lines[0]
    assert lines[-1].startswith("compiled a compiled graph of 36 ops (-O2) in 0.5 s")
    assert lines[-1].endswith("modelled 12.5 s on the chip's compiler")


def test_a_short_compile_and_other_ranks_say_nothing(lines, monkeypatch):
    with progress.compile_wait("aten::mm.default (-O1)", lambda: 0) as done:
        done(0.1)
    monkeypatch.setenv("LOCAL_RANK", "1")  # under torchrun only local rank 0 speaks
    with progress.compile_wait("aten::mm.default (-O1)", lambda: 0) as done:
        time.sleep(0.4)
        done(1.0)
    assert lines == []
