"""Graph boundaries and the compile policy, table-driven."""

from __future__ import annotations

import pytest
from trnsim.policy.boundaries import Cut, NextOp, Policy, decide
from trnsim.policy.compile_policy import (
    GraphHistory,
    predicted_compile_ns,
    predicted_saving_ns,
    should_request,
)

P = Policy(size_cap=8, low_water=1, drain_min_ops=4)
OK = NextOp(fusible=True, dynamic=False, stream=0)


@pytest.mark.parametrize(
    ("buffered", "stream", "op", "depth", "expected"),
    [
        (0, 0, OK, 0, Cut.NONE),
        (3, 0, OK, 0, Cut.NONE),
        (3, 0, NextOp(True, True, 0), 5, Cut.DYNAMIC_SHAPE),
        (3, 0, NextOp(False, False, 0), 5, Cut.NOT_FUSIBLE),
        (0, 0, NextOp(False, False, 0), 5, Cut.NOT_FUSIBLE),
        (3, 0, NextOp(True, False, 0, verified=False), 5, Cut.FIRST_SIGHT),
        (0, 0, NextOp(True, False, 0, verified=False), 5, Cut.FIRST_SIGHT),
        (3, 0, NextOp(True, False, 1), 5, Cut.STREAM_CHANGE),
        (3, 0, NextOp(True, False, 0, hazard=True), 5, Cut.HAZARD),
        (8, 0, OK, 5, Cut.SIZE_CAP),
        (4, 0, OK, 0, Cut.QUEUE_DRAINED),
        (4, 0, OK, 1, Cut.NONE),
        (2, 0, OK, 0, Cut.NONE),
    ],
)
def test_decide(buffered, stream, op, depth, expected):
    assert decide(buffered, stream, op, depth, P) is expected


def test_which_cuts_run_the_op_on_its_own():
    assert Cut.NOT_FUSIBLE.runs_op_eagerly and Cut.DYNAMIC_SHAPE.runs_op_eagerly
    assert Cut.FIRST_SIGHT.runs_op_eagerly
    assert not Cut.SIZE_CAP.runs_op_eagerly and not Cut.SYNC.runs_op_eagerly


@pytest.mark.parametrize(
    ("history", "saving", "compile_ns", "shared", "expected"),
    [
        (GraphHistory(seen=1), 1e3, 1e6, False, False),  # first sight, cheap graph: wait
        (GraphHistory(seen=1), 2e6, 1e6, False, True),  # pays back at once
        (GraphHistory(seen=1), 1e3, 1e6, True, True),  # a shared cache makes asking cheap
        (GraphHistory(seen=2), 1e3, 1e6, False, True),  # second sight
        (GraphHistory(seen=5, requested=True), 1e9, 1, True, False),
        (GraphHistory(seen=5, failed=True), 1e9, 1, True, False),  # gave up
    ],
)
def test_should_request(history, saving, compile_ns, shared, expected):
    assert should_request(history, saving, compile_ns, shared) is expected


def test_predictions_grow_with_size():
    assert predicted_compile_ns(100) > predicted_compile_ns(10)
    assert (
        predicted_saving_ns(10, 15_000, 20_000, 1_500)
        > predicted_saving_ns(2, 15_000, 20_000, 1_500)
        > 0
    )
