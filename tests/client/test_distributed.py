"""The neuron c10d backend in one process (a group of one): how groups are made, its errors,
work handles, FSDP2's storage free/alloc, and outputs read before anyone waited. The
multi-rank behaviour runs through torchrun in tests/distributed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from trnsim.client import distributed as nd
from trnsim.client.core import runtime


@pytest.fixture
def group() -> Iterator[nd.NeuronProcessGroup]:
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        pg = dist.group.WORLD
        assert isinstance(pg, nd.NeuronProcessGroup)
        yield pg
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["neuron", "cpu:gloo,neuron:neuron", None])
def test_the_ways_to_ask_for_the_backend_give_a_neuron_group(backend: str | None) -> None:
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert isinstance(dist.group.WORLD, nd.NeuronProcessGroup)
        t = torch.arange(4.0, device="neuron")
        dist.all_reduce(t)
        c = torch.arange(3.0)  # CPU tensors go to gloo
        dist.all_reduce(c)
        assert t.cpu().tolist() == [0, 1, 2, 3] and c.tolist() == [0, 1, 2]
    finally:
        dist.destroy_process_group()


def test_work_handles_and_counters(group: nd.NeuronProcessGroup) -> None:
    before = torch.neuron.metrics()
    t = torch.ones(256, device="neuron")
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, nd.NeuronWork)
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert work.get_future().value()[0] is t and work.result()[0] is t
    assert work.start_ns >= work.arrival_ns and work.end_ns >= work.start_ns
    work.wait()
    after = torch.neuron.metrics()
    assert after["collectives"] - before["collectives"] == 1
    assert after["collective_bytes"] - before["collective_bytes"] == 1024
    assert after["host_ns"] - before["host_ns"] >= runtime.get().target.host_submit_ns


def test_reduce_ops_gloo_lacks(group: nd.NeuronProcessGroup) -> None:
    t = torch.full((4,), 3.0, device="neuron")
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert t.cpu().tolist() == [3.0] * 4
    dist.all_reduce(t, op=dist.ReduceOp.PREMUL_SUM(0.5))  # type: ignore[operator]
    assert t.cpu().tolist() == [1.5] * 4
    out = torch.empty(4, device="neuron")
    dist.reduce_scatter_single(out, t, op=dist.ReduceOp.AVG)
    assert out.cpu().tolist() == [1.5] * 4
    i = torch.full((2,), 7, device="neuron")
    dist.all_reduce(i, op=dist.ReduceOp.AVG)
    assert i.cpu().tolist() == [7, 7]


def test_bad_input_is_refused_with_what_to_do(group: nd.NeuronProcessGroup) -> None:
    out = torch.empty(3, device="neuron")
    with pytest.raises(nd.CollectiveError, match="one device"):
        dist.all_gather_single(out, torch.ones(3))
    with pytest.raises(nd.CollectiveError, match="needs 1 x the input's 2"):
        dist.all_gather_single(out, torch.ones(2, device="neuron"))
    with pytest.raises(nd.CollectiveError, match="needs 1 x the output's 3"):
        dist.reduce_scatter_single(out, torch.ones(5, device="neuron"))


def test_functional_collectives_run_on_neuron_tensors(group: nd.NeuronProcessGroup) -> None:
    t = torch.arange(6.0, device="neuron").view(2, 3)
    gathered = funcol.all_gather_single(t, 0, group)
    scattered = funcol.reduce_scatter_single(t, "sum", 0, group)
    reduced = funcol.all_reduce(t, "sum", group)
    swapped = funcol.all_to_all_single(t, None, None, group)
    for r in (gathered, scattered, reduced, swapped):
        assert r.device.type == "neuron"
        assert torch.equal(r.cpu(), t.cpu())


def test_an_output_read_before_wait_waits_for_its_collective(
    group: nd.NeuronProcessGroup,
) -> None:
    rt = runtime.get()
    t = torch.ones(64, device="neuron")
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, nd.NeuronWork)
    ptr = t.untyped_storage().data_ptr()
    assert rt.awaiting.get(ptr) == work.end_ns
    (t + 1).cpu()  # read without wait(): the op's stream waited, the entry is gone
    assert ptr not in rt.awaiting
    assert rt.timeline.stream_end_ns(rt.stream) >= work.end_ns


def test_parked_storage_gives_back_its_hbm_and_takes_it_again() -> None:
    rt = runtime.get()
    t = torch.empty(1 << 20, device="neuron")
    base = torch.neuron.memory_allocated()
    storage = t.untyped_storage()
    rt.memory.park(storage)
    assert torch.neuron.memory_allocated() == base - (4 << 20)
    rt.memory.park(storage)  # twice: nothing more
    assert torch.neuron.memory_allocated() == base - (4 << 20)
    rt.memory.unpark(storage)
    assert torch.neuron.memory_allocated() == base
    rt.memory.park(storage)
    del t, storage  # dies parked: its block is not freed twice
    assert torch.neuron.memory_allocated() == base - (4 << 20)
