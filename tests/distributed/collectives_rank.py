"""One rank of the collectives check, run by tests/distributed/test_torchrun.py under torchrun.

Every collective runs twice on the same per-rank data: on neuron tensors through the neuron
backend, and on CPU tensors through a plain gloo group (PyTorch's own). The results must be
bit-identical. Then a timed all-reduce: the ranks arrive at different simulated times and
must agree on its start (the last arrival) and end. Each rank writes what it saw as JSON to
OUT_DIR/rank<r>.json; the test reads them all. Any mismatch raises here, naming the case.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from trnsim.client import distributed as nd

Tensor = torch.Tensor


def data(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int) -> Tensor:
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def same(name: str, neuron: Tensor | list[Tensor], cpu: Tensor | list[Tensor]) -> None:
    ns = neuron if isinstance(neuron, list) else [neuron]
    cs = cpu if isinstance(cpu, list) else [cpu]
    for a, b in zip(ns, cs, strict=True):
        a = a.cpu()
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            raise AssertionError(f"{name}: neuron {a.flatten()[:6]} != gloo {b.flatten()[:6]}")


def check_numerics(rank: int, world: int, cpu_group: dist.ProcessGroup) -> list[str]:
    checked: list[str] = []

    def both(
        name: str, run: Callable[[str, dist.ProcessGroup | None], Tensor | list[Tensor]]
    ) -> None:
        same(name, run("neuron", None), run("cpu", cpu_group))
        checked.append(name)

    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
        for op in ops:

            def all_reduce(dev: str, group: dist.ProcessGroup | None, op=op, dtype=dtype) -> Tensor:
                t = data(rank, (5, 7), dtype, 1).to(dev)
                dist.all_reduce(t, op=op, group=group)
                return t

            both(f"all_reduce {op} {dtype}", all_reduce)

        def broadcast(dev: str, group: dist.ProcessGroup | None, dtype=dtype) -> Tensor:
            t = data(rank, (33,), dtype, 2).to(dev)
            dist.broadcast(t, src=world - 1, group=group)
            return t

        def all_gather(dev: str, group: dist.ProcessGroup | None, dtype=dtype) -> list[Tensor]:
            t = data(rank, (3, 4), dtype, 3).to(dev)
            out = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(out, t, group=group)
            return out

        def all_gather_into_tensor(
            dev: str, group: dist.ProcessGroup | None, dtype=dtype
        ) -> Tensor:
            t = data(rank, (3, 4), dtype, 4).to(dev)
            out = torch.empty((3 * world, 4), dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, t, group=group)
            return out

        def reduce_scatter_tensor(dev: str, group: dist.ProcessGroup | None, dtype=dtype) -> Tensor:
            t = data(rank, (4 * world, 3), dtype, 5).to(dev)
            out = torch.empty((4, 3), dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(out, t, group=group)
            return out

        def reduce_scatter(dev: str, group: dist.ProcessGroup | None, dtype=dtype) -> Tensor:
            ins = [data(rank, (6,), dtype, 6 + i).to(dev) for i in range(world)]
            out = torch.empty(6, dtype=dtype, device=dev)
            dist.reduce_scatter(out, ins, group=group)
            return out

        def all_to_all_single(dev: str, group: dist.ProcessGroup | None, dtype=dtype) -> Tensor:
            t = data(rank, (2 * world, 3), dtype, 7).to(dev)
            out = torch.empty_like(t)
            dist.all_to_all_single(out, t, group=group)
            return out

        def all_to_all_uneven(dev: str, group: dist.ProcessGroup | None, dtype=dtype) -> Tensor:
            # rank r sends j + 1 rows to rank j, so it receives r + 1 rows from each rank
            ins = [j + 1 for j in range(world)]
            outs = [rank + 1] * world
            t = data(rank, (sum(ins), 2), dtype, 8).to(dev)
            out = torch.empty((sum(outs), 2), dtype=dtype, device=dev)
            dist.all_to_all_single(out, t, outs, ins, group=group)
            return out

        for fn in (
            broadcast,
            all_gather,
            all_gather_into_tensor,
            reduce_scatter_tensor,
            reduce_scatter,
            all_to_all_single,
            all_to_all_uneven,
        ):
            both(f"{fn.__name__} {dtype}", fn)

    # AVG (gloo has none): the neuron backend sums, then divides, as the reference does.
    t = data(rank, (8,), torch.float32, 9)
    n = t.to("neuron")
    dist.all_reduce(n, op=dist.ReduceOp.AVG)
    ref = t.clone()
    dist.all_reduce(ref, group=cpu_group)
    same("all_reduce AVG", n, ref / world)
    checked.append("all_reduce AVG float32")

    # A non-contiguous tensor (a transposed view) and an async handle.
    def transposed(dev: str, group: dist.ProcessGroup | None) -> Tensor:
        base = data(rank, (6, 4), torch.float32, 10).to(dev)
        view = base.t()
        work = dist.all_reduce(view, group=group, async_op=True)
        assert work is not None
        work.wait()
        return base

    both("all_reduce of a transposed view, async", transposed)

    # send / recv around a ring
    src, dst = (rank - 1) % world, (rank + 1) % world
    for dev in ("neuron", "cpu"):
        out = data(rank, (10,), torch.float32, 11).to(dev)
        got = torch.empty(10, device=dev)
        group = None if dev == "neuron" else cpu_group
        if rank % 2 == 0:
            dist.send(out, dst, group=group)
            dist.recv(got, src, group=group)
        else:
            dist.recv(got, src, group=group)
            dist.send(out, dst, group=group)
        same(f"send/recv on {dev}", got, data(src, (10,), torch.float32, 11))
    checked.append("send/recv")
    dist.barrier()
    return checked


def check_timeline(rank: int, world: int) -> dict[str, object]:
    """Rank r does r + 1 matmuls first, so the ranks arrive at different simulated times."""
    torch.neuron.synchronize()
    a = torch.randn(256, 256, device="neuron")
    for _ in range(rank + 1):
        a = a @ a / 16
    t = torch.ones(1 << 16, device="neuron")
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, nd.NeuronWork), type(work)
    compute_end_before_wait = torch.neuron.metrics()["wall_ns"]
    b = a @ a  # overlaps the all-reduce: nothing waited yet
    work.wait()
    c = t * 2  # after wait(): starts when the all-reduce has ended
    torch.neuron.synchronize()
    assert float(c[0]) == 2.0 * world
    pg = dist.group.WORLD
    assert isinstance(pg, nd.NeuronProcessGroup)
    del b
    return {
        "arrival": work.arrival_ns,
        "start": work.start_ns,
        "end": work.end_ns,
        "nbytes": t.numel() * 4,
        "hosts": pg.topology.hosts,
        "local": pg.topology.per_host,
        "host_after_sync": torch.neuron.metrics()["host_ns"],
        "wall_before_wait": compute_end_before_wait,
    }


def main() -> None:
    out_dir = sys.argv[1]
    dist.init_process_group("neuron", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    cpu_group = dist.new_group(backend="gloo")
    checked = check_numerics(rank, world, cpu_group)
    timed = check_timeline(rank, world)
    metrics = torch.neuron.metrics()
    report = {
        "rank": rank,
        "world": world,
        "checked": checked,
        "timed": timed,
        "collectives": metrics["collectives"],
        "backend": dist.get_backend(),
        "mode": torch.neuron.get_eager_mode(),
        "node": os.environ.get("GROUP_RANK"),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
