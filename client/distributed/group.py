"""The neuron c10d process group: gloo moves the data, the simulated chip prices the time."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Store,
)
from torch._C._distributed_c10d import Work as _CWork
from trnsim.client.core import env, runtime
from trnsim.client.distributed import timing
from trnsim.client.distributed.errors import CollectiveError
from trnsim.client.distributed.reductions import RedOp, Reduction, reduction, scale
from trnsim.client.distributed.staging import NAME, Staging, check_same_device, nbytes, stage
from trnsim.client.distributed.work import NeuronWork, finished, last
from trnsim.simulator import cost_model

Tensor = torch.Tensor


def host_identity() -> str:
    """The simulated host this process is on (what decides NeuronLink or EFA)."""
    node = env.sim_node()
    return node if node is not None else env.hostname()


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective, as the group's one path stages, runs and prices it. Made first in
    each collective: its tensors' devices are checked here."""

    kind: str  # its algorithm, as the cost model prices it
    what: str  # its name in messages
    nbytes: int  # the bytes it moves, as the cost model counts them
    writes: list[Tensor]  # what it writes: the work's result
    reads: list[Tensor] | None = None  # what it only reads; None: it reads `writes` (in place)
    elementwise: bool = False  # (all_reduce, broadcast) a dense view goes in memory order
    checked: bool = True  # its tensors must be on one device

    def __post_init__(self) -> None:
        if self.checked:
            check_same_device([*(self.reads or []), *self.writes], self.what)


def _regroup(flat: list[Tensor], like: list[list[Tensor]]) -> list[list[Tensor]]:
    """flat, cut into lists of the lengths of like's."""
    out, i = [], 0
    for group in like:
        out.append(flat[i : i + len(group)])
        i += len(group)
    return out


class NeuronProcessGroup(dist.ProcessGroup):  # type: ignore[misc]
    """A c10d process group over gloo whose collectives are priced on the simulated chip."""

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._rank, self._size = rank, size
        self._timeout = timeout
        self._group_name = self._group_desc = ""
        try:
            self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        except RuntimeError as e:
            raise CollectiveError(
                f"the neuron process group (rank {rank} of {size}) could not connect its gloo "
                f"transport: {e}. Check MASTER_ADDR/MASTER_PORT and that every rank started"
            ) from e
        self.hosts = self._exchange_hosts()
        self.queue = timing.CollectiveQueue.new(cost_model.Topology.of(self.hosts))

    @property
    def stream(self) -> int:
        """The id of the group's collective queue on the timeline."""
        return self.queue.stream

    @property
    def topology(self) -> cost_model.Topology:
        return self.queue.topology

    # -- identity ----------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return NAME

    @property
    def name(self) -> str:  # type: ignore[override]
        return NAME

    # c10d keeps a group's name and description in its backends, which a Python group has
    # none of: they are kept here (DeviceMesh and the functional collectives look groups up
    # by name).
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._group_name

    @property
    def group_desc(self) -> str:  # type: ignore[override]
        return self._group_desc

    def __repr__(self) -> str:
        return f"NeuronProcessGroup(rank={self._rank}, size={self._size}, {self.topology})"

    def _exchange_hosts(self) -> list[str]:
        """Every rank's simulated host (names hashed to int64: gloo moves tensors)."""
        me = host_identity()
        mine = torch.tensor([zlib.crc32(me.encode())], dtype=torch.int64)
        every = [torch.zeros(1, dtype=torch.int64) for _ in range(self._size)]
        self._run("topology", lambda: self._gloo.allgather([every], [mine]))
        return [str(int(t.item())) for t in every]

    # -- the one path of every collective ----------------------------------------------------
    def _run(self, what: str, start: Callable[[], _CWork]) -> None:
        try:
            start().wait()
        except RuntimeError as e:
            raise CollectiveError(
                f"{what} on the neuron process group failed on rank {self._rank} of "
                f"{self._size}: {e}. Another rank may have died or timed out (timeout "
                f"{self._timeout}); its own error is the first to read"
            ) from e

    def _collective(
        self,
        c: Collective,
        gloo: Callable[[Staging], _CWork],
        reduced: Reduction | None = None,
    ) -> NeuronWork:
        """Stages c's tensors, runs `gloo` over them (a reduction's factor first, its
        divisor after), and, on device tensors, puts it on the group's queue at the time
        the ranks agree on."""
        host = stage(c.what, c.reads or [], c.writes, c.elementwise, check=False)
        host = _premultiplied(host, reduced, in_place=c.reads is None)

        def run() -> None:
            self._run(c.what, lambda: gloo(host))
            host.staged.back()
            if reduced is not None:
                scale(host.writes, 1.0, reduced.divisor)

        if not host.device:  # CPU tensors: gloo alone, nothing on the chip's timeline
            run()
            return finished(c.writes)
        rt = runtime.get()
        arrival = self.queue.arrive(rt)
        start_ns = self._agree(arrival, c.what)
        if rt.numerics:  # (shape-only mode: the collective is priced and ordered, no more)
            run()
        duration = self.queue.price(rt, c.kind, c.nbytes)
        end = self.queue.occupy(rt, c.kind, start_ns, duration, c.nbytes, c.writes)
        return NeuronWork(c.writes, end, True, start_ns, arrival)

    def _agree(self, arrival: int, what: str) -> int:
        """The simulated time every rank starts the collective: the last one's arrival."""
        opts = AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        return timing.agree(
            arrival, lambda t: self._run(what, lambda: self._gloo.allreduce([t], opts))
        )

    def _reduction(self, op: dist.ReduceOp | RedOp, what: str) -> Reduction:
        return reduction(op, self._size, what)

    # -- collectives ---------------------------------------------------------------------------
    def allreduce(  # type: ignore[override]
        self, tensors: list[Tensor], opts: AllreduceOptions | None = None
    ) -> NeuronWork:
        opts = opts or AllreduceOptions()
        c = Collective("all_reduce", "all_reduce", nbytes(tensors), tensors, elementwise=True)
        reduced = self._reduction(opts.reduceOp, "all_reduce")
        gopts = AllreduceOptions()
        gopts.reduceOp = reduced.gloo_op
        return self._collective(c, lambda h: self._gloo.allreduce(h.writes, gopts), reduced)

    def allreduce_coalesced(
        self, tensors: list[Tensor], opts: AllreduceCoalescedOptions | None = None
    ) -> NeuronWork:
        one = AllreduceOptions()
        one.reduceOp = (opts or AllreduceCoalescedOptions()).reduceOp
        if not tensors:
            return finished([])
        flat = torch.cat([t.reshape(-1) for t in tensors])
        work = self.allreduce([flat], one)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n
        work._result = tensors
        return work

    def broadcast(  # type: ignore[override]
        self, tensors: list[Tensor], opts: BroadcastOptions | None = None
    ) -> NeuronWork:
        opts = opts or BroadcastOptions()
        c = Collective("broadcast", "broadcast", nbytes(tensors), tensors, elementwise=True)
        gopts = BroadcastOptions()
        gopts.rootRank, gopts.rootTensor = opts.rootRank, opts.rootTensor
        return self._collective(c, lambda h: self._gloo.broadcast(h.writes, gopts))

    def allgather(  # type: ignore[override]
        self,
        outputs: list[list[Tensor]],
        inputs: list[Tensor],
        opts: AllgatherOptions | None = None,
    ) -> NeuronWork:
        flat = [t for ol in outputs for t in ol]
        c = Collective("all_gather", "all_gather", nbytes(flat), flat, inputs)
        return self._collective(
            c,
            lambda h: self._gloo.allgather(
                _regroup(h.writes, outputs), h.reads, AllgatherOptions()
            ),
        )

    def all_gather_single(
        self, output: Tensor, input: Tensor, opts: AllgatherOptions | None = None
    ) -> NeuronWork:
        what = "all_gather_into_tensor"
        c = Collective("all_gather", what, nbytes([output]), [output], [input])
        if output.numel() != input.numel() * self._size:
            raise CollectiveError(
                f"{what}: output has {output.numel()} elements; it needs "
                f"{self._size} x the input's {input.numel()}"
            )
        return self._collective(
            c,
            lambda h: self._gloo._allgather_base(
                h.writes[0].reshape(-1), h.reads[0].reshape(-1), AllgatherOptions()
            ),
        )

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: list[Tensor], inputs: list[Tensor], opts: AllgatherOptions | None = None
    ) -> NeuronWork:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return last(works, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]

    def reduce_scatter(  # type: ignore[override]
        self,
        outputs: list[Tensor],
        inputs: list[list[Tensor]],
        opts: ReduceScatterOptions | None = None,
    ) -> NeuronWork:
        opts = opts or ReduceScatterOptions()
        flat = [t for il in inputs for t in il]
        c = Collective("reduce_scatter", "reduce_scatter", nbytes(flat), outputs, flat)
        reduced = self._reduction(opts.reduceOp, "reduce_scatter")
        gopts = ReduceScatterOptions()
        gopts.reduceOp = reduced.gloo_op
        return self._collective(
            c,
            lambda h: self._gloo.reduce_scatter(h.writes, _regroup(h.reads, inputs), gopts),
            reduced,
        )

    def reduce_scatter_single(
        self, output: Tensor, input: Tensor, opts: ReduceScatterOptions | None = None
    ) -> NeuronWork:
        opts = opts or ReduceScatterOptions()
        what = "reduce_scatter_tensor"
        c = Collective("reduce_scatter", what, nbytes([input]), [output], [input])
        if input.numel() != output.numel() * self._size:
            raise CollectiveError(
                f"{what}: input has {input.numel()} elements; it needs "
                f"{self._size} x the output's {output.numel()}"
            )
        reduced = self._reduction(opts.reduceOp, "reduce_scatter")
        gopts = ReduceScatterOptions()
        gopts.reduceOp = reduced.gloo_op
        return self._collective(
            c,
            lambda h: self._gloo._reduce_scatter_base(
                h.writes[0].reshape(-1), h.reads[0].reshape(-1), gopts
            ),
            reduced,
        )

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter_single_coalesced(
        self,
        outputs: list[Tensor],
        inputs: list[Tensor],
        opts: ReduceScatterOptions | None = None,
    ) -> NeuronWork:
        works = [
            self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)
        ]
        return last(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def all_to_all_single(  # type: ignore[override]
        self,
        output: Tensor,
        input: Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions | None = None,
    ) -> NeuronWork:
        c = Collective("all_to_all", "all_to_all_single", nbytes([input]), [output], [input])
        return self._collective(
            c,
            lambda h: self._gloo.alltoall_base(
                h.writes[0],
                h.reads[0],
                list(output_split_sizes),
                list(input_split_sizes),
                AllToAllOptions(),
            ),
        )

    alltoall_base = all_to_all_single  # type: ignore[assignment]

    def alltoall(  # type: ignore[override]
        self, outputs: list[Tensor], inputs: list[Tensor], opts: AllToAllOptions | None = None
    ) -> NeuronWork:
        c = Collective("all_to_all", "all_to_all", nbytes(inputs), outputs, inputs)
        return self._collective(
            c, lambda h: self._gloo.alltoall(h.writes, h.reads, AllToAllOptions())
        )

    def barrier(self, opts: BarrierOptions | None = None) -> NeuronWork:  # type: ignore[override]
        """Every rank's host waits until the last one arrives (simulated time agreed too)."""
        if not runtime.initialized():
            self._run("barrier", lambda: self._gloo.barrier(BarrierOptions()))
            return finished([])
        rt = runtime.get()
        rt.flush("sync")
        end = self._agree(rt.now_ns(), "barrier")
        rt.synchronize()  # (nothing was recorded since the flush: the device's queues)
        rt.wait_until(end)
        return NeuronWork([], end, False)

    def send(self, tensors: list[Tensor], dst: int, tag: int) -> NeuronWork:
        """The message carries the sender's ready time; the send ends when its data has
        left (the receiver's end also waits for the receiver)."""
        host = stage("send", tensors, [])
        size = nbytes(tensors)
        rt = runtime.get() if host.device else None
        start = 0 if rt is None else self.queue.arrive(rt)
        header = torch.tensor([start], dtype=torch.int64)
        self._run("send", lambda: self._gloo.send([header], dst, tag))
        if rt is None or rt.numerics:
            self._run("send", lambda: self._gloo.send(host.reads, dst, tag))
        if rt is None:
            return finished(tensors)
        end = self.queue.occupy(rt, "send", start, self._p2p_ns(rt, size, dst), size, [])
        return NeuronWork(tensors, end, True)

    def recv(self, tensors: list[Tensor], src: int, tag: int) -> NeuronWork:
        host = stage("recv", [], tensors)
        header = torch.zeros(1, dtype=torch.int64)
        rt = runtime.get() if host.device else None
        ready = 0 if rt is None else self.queue.arrive(rt)
        self._run("recv", lambda: self._gloo.recv([header], src, tag))
        if rt is None or rt.numerics:
            self._run("recv", lambda: self._gloo.recv(host.writes, src, tag))
            host.staged.back()
        if rt is None:
            return finished(tensors)
        size = nbytes(tensors)
        start = max(ready, int(header.item()))
        end = self.queue.occupy(rt, "recv", start, self._p2p_ns(rt, size, src), size, tensors)
        return NeuronWork(tensors, end, True)

    def _p2p_ns(self, rt: runtime.Runtime, size: int, peer: int) -> int:
        return timing.p2p_ns(rt, size, self.hosts[peer] == self.hosts[self._rank])

    # reduce, gather and scatter: gloo's, over staged tensors, priced as their mirror images.
    def reduce(self, tensors: list[Tensor], opts: ReduceOptions) -> NeuronWork:  # type: ignore[override]
        c = Collective("broadcast", "reduce", nbytes(tensors), tensors, checked=False)
        reduced = self._reduction(opts.reduceOp, "reduce")
        if self._rank != opts.rootRank:  # (only the root's results are the reduction's)
            reduced = dataclasses.replace(reduced, divisor=1.0)
        gopts = type(opts)()
        gopts.reduceOp, gopts.rootRank, gopts.rootTensor = (
            reduced.gloo_op,
            opts.rootRank,
            opts.rootTensor,
        )
        return self._collective(c, lambda h: self._gloo.reduce(h.writes, gopts), reduced)

    def gather(  # type: ignore[override]
        self, outputs: list[list[Tensor]], inputs: list[Tensor], opts: GatherOptions
    ) -> NeuronWork:
        flat = [t for ol in outputs for t in ol]
        size = nbytes(inputs) * self._size
        c = Collective("all_gather", "gather", size, flat, inputs, checked=False)
        return self._collective(
            c, lambda h: self._gloo.gather(_regroup(h.writes, outputs), h.reads, opts)
        )

    def scatter(  # type: ignore[override]
        self, outputs: list[Tensor], inputs: list[list[Tensor]], opts: ScatterOptions
    ) -> NeuronWork:
        flat = [t for il in inputs for t in il]
        size = nbytes(outputs) * self._size
        c = Collective("reduce_scatter", "scatter", size, outputs, flat, checked=False)
        return self._collective(
            c, lambda h: self._gloo.scatter(h.writes, _regroup(h.reads, inputs), opts)
        )


def _premultiplied(host: Staging, reduced: Reduction | None, in_place: bool) -> Staging:
    """The staging with a reduction's factor applied: in place to what an in-place
    collective reduces, else to copies of its inputs (they are not the caller's to change)."""
    if reduced is None or reduced.factor == 1.0:
        return host
    if in_place:
        scale(host.writes, reduced.factor, 1.0)
        return host
    reads = [t.clone() for t in host.reads]
    scale(reads, reduced.factor, 1.0)
    return dataclasses.replace(host, reads=reads)
