"""The simulated timeline: docs/ARCHITECTURE.md's two clocks, deterministic."""

from __future__ import annotations

import pytest
from trnsim.simulator.config import TRN2
from trnsim.simulator.device import Event, Timeline

OVERHEAD = TRN2.launch_overhead_ns


def test_launch_is_asynchronous_and_in_order():
    t = Timeline(TRN2)
    first = t.launch(100_000, engine_ns={"tensor": 80_000})
    assert (first.start_ns, first.end_ns) == (0, OVERHEAD + 100_000)
    assert t.host_ns == 0, "launching does not block the host"
    t.host_work(5_000)
    second = t.launch(10_000)
    assert second.start_ns == first.end_ns, "waits for the previous work on its queue"
    assert second.host_ns == 5_000


def test_idle_device_starts_at_host_time():
    t = Timeline(TRN2)
    t.host_work(50_000)
    launch = t.launch(1_000)
    assert launch.start_ns == 50_000


def test_queue_depth_drains_as_host_time_passes():
    t = Timeline(TRN2)
    for _ in range(4):
        t.launch(10_000)
    assert t.queue_depth() == 4
    t.host_work(OVERHEAD + 10_000)
    assert t.queue_depth() == 3
    t.host_work(2 * (OVERHEAD + 10_000))
    assert t.queue_depth() == 1
    t.synchronize()
    assert t.queue_depth() == 0


def test_synchronize_moves_host_to_the_device_end():
    t = Timeline(TRN2)
    t.launch(40_000)
    waited = t.synchronize()
    assert waited == OVERHEAD + 40_000
    assert t.host_ns == t.now_ns() == OVERHEAD + 40_000
    assert t.sync_waits == 1 and t.sync_wait_ns == waited
    assert t.synchronize() == 0


def test_streams_are_independent_queues():
    t = Timeline(TRN2)
    a = t.launch(100_000, stream=0)
    b = t.launch(1_000, stream=1)
    assert b.start_ns == 0 and b.end_ns < a.end_ns
    t.synchronize(stream=1)
    assert t.host_ns == b.end_ns
    assert t.queue_depth(stream=0) == 1 and t.queue_depth(stream=1) == 0


def test_events_order_work_across_streams():
    t = Timeline(TRN2)
    producer = t.launch(100_000, stream=1)
    ev = Event()
    t.record_event(ev, stream=1)
    assert ev.time_ns == producer.end_ns and not t.event_query(ev)
    t.stream_wait_event(ev, stream=0)
    consumer = t.launch(1_000, stream=0)
    assert consumer.start_ns == producer.end_ns, "the consumer waits for the event"
    assert t.host_ns == 0, "a stream waiting on an event does not block the host"
    t.event_synchronize(ev)
    assert t.event_query(ev) and t.host_ns == producer.end_ns
    start, end = Event(), Event()
    t.record_event(start, stream=0)
    t.launch(7_000, stream=0)
    t.record_event(end, stream=0)
    assert Timeline.elapsed_ns(start, end) == OVERHEAD + 7_000


def test_unrecorded_event_wait_is_a_no_op():
    t = Timeline(TRN2)
    t.stream_wait_event(Event())
    assert t.launch(1).start_ns == 0


def test_busy_time_per_engine_and_host():
    t = Timeline(TRN2)
    t.host_work(20_000)
    t.launch(10_000, engine_ns={"tensor": 6_000, "dma": 9_000})
    t.launch(10_000, engine_ns={"tensor": 4_000})
    snap = t.snapshot()
    assert snap["tensor_busy_ns"] == 10_000 and snap["dma_busy_ns"] == 9_000
    assert snap["host_busy_ns"] == 20_000
    assert snap["device_busy_ns"] == 2 * (OVERHEAD + 10_000)
    assert snap["launches"] == 2


def test_deterministic():
    def run() -> dict[str, int]:
        t = Timeline(TRN2)
        for i in range(50):
            t.host_work(1_000 + i)
            t.launch(10_000 * (i % 3), stream=i % 2)
            if i % 7 == 0:
                t.synchronize()
        return t.snapshot()

    assert run() == run()


def test_a_collective_occupies_its_queue_from_the_agreed_start_and_compute_overlaps_it():
    t = Timeline(TRN2)
    t.launch(100_000)  # compute on stream 0
    coll = 1 << 20
    ready = t.ready_ns(0)
    assert ready == OVERHEAD + 100_000 and t.ready_ns(coll) == 0
    t.occupy(coll, ready + 5_000, 40_000, "collective")  # another rank arrived 5 us later
    assert t.stream_end_ns(coll) == ready + 45_000
    assert t.queue_depth(coll) == 1
    after = t.launch(20_000)  # compute issued after the collective: runs beside it
    assert after.start_ns == ready
    overlap = min(after.end_ns, ready + 45_000) - max(after.start_ns, ready + 5_000)
    assert t.collective_overlap_ns == overlap > 0
    snap = t.snapshot()
    assert snap["collective_busy_ns"] == 40_000
    assert snap["collective_overlap_ns"] == overlap
    t.stream_wait_event(Event(ready + 45_000), 0)  # work.wait(): the stream waits for it
    assert t.launch(1_000).start_ns == ready + 45_000
    t.synchronize()
    assert t.host_ns == t.now_ns()


def test_a_collective_cannot_start_before_its_queue_is_ready():
    t = Timeline(TRN2)
    t.host_work(10_000)
    with pytest.raises(ValueError, match="before it is ready"):
        t.occupy(7, 9_999, 1_000, "collective")


def test_launches_count_their_hbm_traffic_and_reset_with_the_counters():
    t = Timeline(TRN2)
    t.enqueue(1_000, 0, {"dma": 1_000}, hbm_bytes=4096)
    t.enqueue(0, 1, {}, overhead_ns=0)  # (no time at all: finished as it starts)
    snap = t.snapshot()
    assert snap["hbm_bytes"] == 4096 and snap["dma_busy_ns"] == 1_000 and snap["launches"] == 2
    assert t.queue_depth(1) == 0
    t.reset_counters()
    assert t.snapshot()["hbm_bytes"] == 0 and t.host_ns == 0
