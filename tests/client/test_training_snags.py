"""What ordinary training code meets on a device, behaving as on CUDA: pinned memory and
DataLoader(pin_memory=True), CPU tensors mixed in, tensors the device cannot hold,
torch.accelerator's calls."""

from __future__ import annotations

import pytest
import torch
from trnsim.client.core import env, runtime


def test_pin_memory_and_a_pinned_dataloader():
    x = torch.randn(4, 3)
    p = x.pin_memory()
    assert p.is_pinned() and not x.is_pinned() and torch.equal(p, x)
    assert p.pin_memory() is p
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(8, 3)), batch_size=4, pin_memory=True
    )
    before = torch.neuron.metrics()["h2d_async_bytes"]
    total = sum(b.is_pinned() and b.to("neuron", non_blocking=True).sum().item() for (b,) in loader)
    assert total == pytest.approx(float(loader.dataset.tensors[0].sum()), rel=1e-5)
    assert torch.neuron.metrics()["h2d_async_bytes"] - before == 8 * 3 * 4


def test_a_non_blocking_copy_from_pinned_memory_leaves_the_host_free():
    """From pageable memory the host waits for the transfer; from pinned memory it is a DMA
    on the stream (simulated time is deterministic: the test may assert it)."""
    big = torch.randn(1 << 20)
    pinned = big.pin_memory()
    rt = runtime.get()
    rt.synchronize()
    host = rt.timeline.host_ns
    big.to("neuron", non_blocking=True)
    pageable_ns = rt.timeline.host_ns - host
    host = rt.timeline.host_ns
    pinned.to("neuron", non_blocking=True)
    pinned_ns = rt.timeline.host_ns - host
    assert pinned_ns < pageable_ns / 10


def test_a_cpu_tensor_mixed_with_a_neuron_tensor_is_an_error_as_on_cuda():
    d = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        d + torch.ones(3)
    with pytest.raises(RuntimeError, match="same device.*test_training_snags.py"):
        torch.nn.Linear(3, 2).to("neuron")(torch.ones(4, 3))
    assert (d + torch.tensor(2.0)).cpu().tolist() == [3.0] * 3  # a CPU scalar is fine
    idx = torch.tensor([0, 2])  # as are CPU indices (CUDA moves them)
    assert d[idx].cpu().tolist() == [1.0, 1.0]


def test_a_tensor_larger_than_hbm_is_out_of_memory_not_a_host_error():
    """40 GiB: more than the simulated HBM, and more than this host's memory."""
    with pytest.raises(torch.OutOfMemoryError, match="simulated HBM"):
        torch.empty(40 << 30, dtype=torch.uint8, device="neuron")


@pytest.fixture
def small_hbm():
    """A runtime whose compiler plans for 1 MiB of HBM (CompileOptions.hbm_budget_bytes)."""
    saved = runtime._runtime
    rt = runtime._runtime = runtime.Runtime(env.read())
    rt.executables.options.hbm_budget_bytes = 1 << 20
    try:
        yield rt
    finally:
        rt.close()
        runtime._runtime = saved


def test_an_op_whose_graph_cannot_fit_is_out_of_memory_naming_the_line(small_hbm):
    x = torch.ones(1 << 18, device="neuron")  # 1 MiB: x + 1 needs 2 MiB of inputs/outputs
    with pytest.raises(torch.OutOfMemoryError) as e:
        x + 1
    assert "aten::add" in str(e.value) and "test_training_snags.py" in str(e.value)


def test_torch_accelerator_calls_reach_torch_neuron():
    assert torch.accelerator.current_accelerator().type == "neuron"
    x = torch.ones(1024, device="neuron")
    torch.accelerator.synchronize()
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated() > 0
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    assert torch.accelerator.memory_reserved() == torch.neuron.memory_reserved()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_allocated()
    free, total = torch.accelerator.get_memory_info()
    assert total == torch.neuron.mem_get_info()[1] and free <= total
    torch.accelerator.reset_peak_memory_stats()
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["allocation.all.allocated"] == 0
    torch.accelerator.empty_cache()
    del x
