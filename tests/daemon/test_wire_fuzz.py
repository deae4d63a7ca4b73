"""The daemon's wire under a fuzzer (tests/daemon/wire_fuzz.py): random bytes, broken and
valid requests on the Compile stream and the unary methods; one answer per message, a status
that says what was wrong, the daemon up, valid requests answered with a local compile's
bytes. A bounded run here; `make soak` runs a large one."""

from __future__ import annotations

import psutil
import pytest

from .wire_fuzz import Tally, fuzz


def _run(daemon, examples: int, derandomize: bool) -> Tally:
    rss = psutil.Process(daemon.pid()).memory_info().rss
    tally = Tally()
    fuzz(daemon.address, examples, tally, derandomize=derandomize)
    assert tally.sent - tally.cancels == tally.answered
    assert daemon.proc.poll() is None, "the daemon is up"
    assert tally.identical > 0 and tally.statuses["INVALID_REQUEST"] > 0
    grown = psutil.Process(daemon.pid()).memory_info().rss - rss
    print(
        f"\nwire fuzz: {tally.sent} sent ({tally.cancels} cancels), {tally.answered} answered, {dict(tally.statuses)}, "
    )
    print(f"{tally.identical} identical to local compiles, RSS grew {grown >> 20} MiB")
    return tally


@pytest.mark.timeout(600)
def test_every_message_gets_one_sensible_answer(daemon):
    _run(daemon, examples=60, derandomize=True)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_every_message_gets_one_sensible_answer_many(daemon):
    _run(daemon, examples=2000, derandomize=False)


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_sixty_four_clients_for_thirty_seconds(daemon):
    from .soak import soak, warm

    warm(daemon.address)
    report = soak(daemon.address, clients=64, seconds=30)
    print(f"\nsoak: {report}")
    assert report["errors"] == 0 and report["failed_clients"] == 0
    assert daemon.proc.poll() is None
