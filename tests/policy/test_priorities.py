"""The daemon's queue order (policy/priorities.py), table-driven."""

from __future__ import annotations

import pytest
from trnsim.policy.priorities import BACKGROUND, BLOCKING, QueuedJob, most_urgent, rank, runnable


@pytest.mark.parametrize(
    ("first", "second", "why"),
    [
        (QueuedJob(BLOCKING, 1, 10.0), QueuedJob(BACKGROUND, 8, 0.0), "blocking before background"),
        (QueuedJob(BLOCKING, 3, 10.0), QueuedJob(BLOCKING, 1, 0.0), "more waiters first"),
        (QueuedJob(BACKGROUND, 2, 1.0), QueuedJob(BACKGROUND, 2, 2.0), "then the oldest"),
    ],
)
def test_order(first, second, why):
    assert rank(first) < rank(second), why
    assert sorted([second, first], key=rank) == [first, second]


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        ([BACKGROUND], BACKGROUND),
        ([BACKGROUND, BLOCKING], BLOCKING),
        ([BLOCKING], BLOCKING),
        ([], BLOCKING),
    ],
)
def test_most_urgent_waiter_decides(asked, expected):
    assert most_urgent(asked) == expected


def test_nobody_waiting_means_not_runnable_unless_kept_for_the_cache():
    assert not runnable(QueuedJob(BLOCKING, 0, 0.0))
    assert runnable(QueuedJob(BACKGROUND, 1, 0.0))
    assert runnable(QueuedJob(BACKGROUND, 0, 0.0, for_cache=True)), "its asker exited"
