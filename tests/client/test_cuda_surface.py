"""The rest of torch.cuda's surface on torch.neuron: device properties, the memory tools,
a device-to-host copy that does not block, autocast's default dtype, torch.compile's default
backend and custom ops with a CPU kernel only."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from trnsim.client.core import runtime


def test_device_properties_and_capability_are_the_simulated_cores():
    p = torch.neuron.get_device_properties()
    target = runtime.get().target
    assert p.total_memory == target.hbm_bytes and p.sbuf_bytes == target.sbuf_bytes
    assert p.neuron_core_version == target.generation and "NeuronCore" in p.neuron_core_version
    assert torch.neuron.get_device_capability("neuron:0") == (p.major, p.minor)
    assert p.major == int(target.generation.rpartition("-v")[2])
    assert torch.neuron.is_bf16_supported()
    with pytest.raises(RuntimeError, match="neuron:0"):
        torch.neuron.get_device_properties(1)


def test_memory_summary_and_snapshot_show_the_allocators_blocks():
    torch.neuron.synchronize()
    t = torch.empty(3 << 20, dtype=torch.uint8, device="neuron")
    summary = torch.neuron.memory_summary()
    assert "Allocated memory" in summary and "Reserved memory" in summary
    segments = torch.neuron.memory_snapshot()
    blocks = [b for s in segments for b in s["blocks"]]
    mine = [b for b in blocks if b["state"] == "active_allocated" and b["size"] >= 3 << 20]
    assert mine, "the 3 MiB tensor's block is in the snapshot"
    assert sum(s["total_size"] for s in segments) == torch.neuron.memory_reserved()
    assert sum(s["allocated_size"] for s in segments) == torch.neuron.memory_allocated()
    del t


def test_per_process_memory_fraction_caps_what_the_process_may_reserve():
    torch.neuron.empty_cache()
    capacity = torch.neuron.get_device_properties().total_memory
    try:
        torch.neuron.set_per_process_memory_fraction(0.01)
        assert torch.neuron.get_per_process_memory_fraction() == pytest.approx(0.01)
        with pytest.raises(torch.OutOfMemoryError, match="set_per_process_memory_fraction"):
            torch.empty(capacity // 50, dtype=torch.uint8, device="neuron")
        torch.empty(capacity // 200, dtype=torch.uint8, device="neuron")  # below the cap
    finally:
        torch.neuron.set_per_process_memory_fraction(1.0)
    with pytest.raises(ValueError, match="0~1"):
        torch.neuron.set_per_process_memory_fraction(1.5)


def test_utilization_is_the_busy_share_of_the_simulated_time():
    x = torch.randn(512, 512, device="neuron")
    torch.neuron.utilization()  # the window starts here
    for _ in range(20):
        x = x @ x / 512
    assert 0 < torch.neuron.utilization() <= 100
    runtime.get().host_work(10**9)  # a simulated second of host time, the device idle
    assert torch.neuron.utilization() == 0


def test_non_blocking_copy_to_the_cpu_lands_in_pinned_memory_without_a_wait(metrics_delta):
    x = torch.randn(256, 256, device="neuron")
    y = x.t() * 2
    out = y.to("cpu", non_blocking=True)
    waits = metrics_delta()
    assert out.is_pinned() and out.stride() == (1, 256)
    assert waits["d2h_async_bytes"] == out.nbytes and waits["sync_waits"] == 0
    torch.neuron.synchronize()
    assert torch.equal(out, x.cpu().t() * 2)
    as_double = x.to("cpu", torch.float64, non_blocking=True)
    assert as_double.dtype == torch.float64 and torch.equal(as_double, x.cpu().double())
    assert not x.cpu().is_pinned(), "a blocking copy is pageable memory"


def test_autocast_without_a_dtype_is_bfloat16_on_every_thread():
    a = torch.randn(8, 8, device="neuron")
    with torch.autocast("neuron"):
        assert (a @ a).dtype == torch.bfloat16
    seen = []

    def other_thread() -> None:
        with torch.autocast("neuron"):
            seen.append((a @ a).dtype)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen == [torch.bfloat16]
    with torch.autocast("neuron", dtype=torch.float16):
        assert (a @ a).dtype == torch.float16, "an explicit dtype still wins"
    torch.set_autocast_dtype("neuron", torch.float16)
    try:
        with torch.autocast("neuron"):
            assert (a @ a).dtype == torch.float16, "so does torch.set_autocast_dtype"
    finally:
        torch.set_autocast_dtype("neuron", torch.bfloat16)


def test_inductor_on_neuron_tensors_names_the_neuron_backend():
    model = torch.nn.Linear(4, 4).to("neuron")
    x = torch.randn(2, 4, device="neuron")
    torch._dynamo.reset()
    with warnings.catch_warnings():  # inductor's own imports warn (torch.jit deprecations)
        warnings.simplefilter("ignore")
        with pytest.raises(Exception, match='backend="neuron"'):
            torch.compile(model)(x)
    torch._dynamo.reset()


def test_a_custom_op_with_a_cpu_kernel_only_says_what_to_do():
    @torch.library.custom_op("trnsim_test::cpu_only", mutates_args=(), device_types="cpu")
    def cpu_only(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @torch.library.custom_op("trnsim_test::anywhere", mutates_args=())
    def anywhere(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.ones(3, device="neuron")
    with pytest.raises(NotImplementedError, match="register_kernel"):
        cpu_only(x)
    assert torch.equal(cpu_only(x.cpu()), torch.full((3,), 2.0))
    assert anywhere(x).device.type == "neuron", "an op for every device runs on neuron"
    torch.neuron.register_kernel(
        cpu_only, cost=lambda t: torch.neuron.KernelCost(engine="vector", ns=t.numel())
    )
    assert torch.equal(cpu_only(x).cpu(), torch.full((3,), 2.0)), "with a neuron kernel it runs"
