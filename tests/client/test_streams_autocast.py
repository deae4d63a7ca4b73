"""Streams and events on the simulated queues; autocast like CUDA's."""

from __future__ import annotations

import torch


def _big(n: int = 512) -> torch.Tensor:
    return torch.randn(n, n).to("neuron")


def test_work_on_two_streams_overlaps_and_events_order_it():
    a, b = _big(), _big()
    torch.neuron.synchronize()
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    assert s1 != s2 and torch.neuron.current_stream() == torch.neuron.default_stream()
    start = torch.neuron.Event(enable_timing=True)
    start.record()
    with torch.neuron.stream(s1):
        assert torch.neuron.current_stream() == s1
        for _ in range(5):
            a = a @ b
        done = torch.neuron.Event(enable_timing=True)
        done.record()
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    assert not s1.query(), "the host did not wait: the stream is still busy"
    s2.wait_event(done)
    with torch.neuron.stream(s2):
        c = a + 1
        after = torch.neuron.Event(enable_timing=True)
        after.record()
    after.synchronize()
    assert after.query() and done.query()
    assert start.elapsed_time(done) > 0
    assert done.elapsed_time(after) > 0, "s2's work ran after the event it waited for"
    torch.neuron.synchronize()
    assert s1.query() and s2.query()
    assert torch.isfinite(c).all().item()


def test_synchronize_waits_for_the_device(metrics_delta):
    a = _big(1024)
    torch.neuron.synchronize()
    before = torch.neuron.metrics()
    for _ in range(3):
        a = a @ a
    mid = torch.neuron.metrics()
    assert mid["host_ns"] - before["host_ns"] < mid["wall_ns"] - before["host_ns"], (
        "launches are asynchronous"
    )
    torch.neuron.synchronize()
    after = torch.neuron.metrics()
    assert after["host_ns"] == after["wall_ns"]
    assert metrics_delta()["sync_wait_ns"] > 0


def test_simulated_time_is_deterministic():
    def step() -> int:
        torch.neuron.synchronize()
        t0 = torch.neuron.metrics()["wall_ns"]
        x = torch.ones(256, 256, device="neuron")
        for _ in range(4):
            x = torch.relu(x @ x) * 0.5
        x.sum().item()
        return torch.neuron.metrics()["wall_ns"] - t0

    step()
    assert step() == step()


def test_autocast_runs_matmuls_in_bfloat16_like_cuda():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    dev = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    x = torch.randn(3, 16)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y = dev(x.to("neuron"))
        logs = torch.log_softmax(y, dim=-1)
    assert y.dtype == torch.bfloat16 and logs.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = cpu(x)
    assert torch.equal(y.cpu(), expected)
    logs.sum().backward()
    assert dev[0].weight.grad.dtype == torch.float32
    z = dev(x.to("neuron"))
    assert z.dtype == torch.float32, "outside autocast nothing is cast"
