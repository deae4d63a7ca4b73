"""Collectives in simulated time: each rank's arrival, the start the ranks agree on, the price
the cost model gives, and the group's collective queue they occupy."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from trnsim.client.core import runtime
from trnsim.client.core.errors import user_location
from trnsim.client.distributed.staging import on_device, storage_ptr
from trnsim.simulator import cost_model

Tensor = torch.Tensor
# Stream ids of the collective queues: one per process group, clear of torch.neuron.Stream ids.
COLLECTIVE_STREAM_BASE = 1 << 20
_group_ids = iter(range(1 << 20))


@dataclasses.dataclass(frozen=True)
class CollectiveQueue:
    """One process group's queue on this rank's timeline, and the links its ranks span."""

    stream: int
    topology: cost_model.Topology

    @classmethod
    def new(cls, topology: cost_model.Topology) -> CollectiveQueue:
        """The queue of a new group (its own stream id)."""
        return cls(COLLECTIVE_STREAM_BASE + next(_group_ids), topology)

    def arrive(self, rt: runtime.Runtime) -> int:
        """This rank's arrival at a collective: the recorded ops that produce its inputs run
        first, the host submits it, and it waits for the current stream and the group's
        queue."""
        rt.flush("collective")
        rt.host_work(rt.target.host_submit_ns)
        return max(rt.ready_ns(rt.stream), rt.ready_ns(self.stream))

    def price(self, rt: runtime.Runtime, kind: str, nbytes: int) -> int:
        """The ns a collective of `kind` over nbytes lasts on the group's links."""
        return int(cost_model.collective_cost(rt.target, kind, nbytes, self.topology).ns)

    def occupy(
        self,
        rt: runtime.Runtime,
        kind: str,
        start_ns: int,
        duration: int,
        nbytes: int,
        written: list[Tensor],
    ) -> int:
        """Puts a collective on the group's queue and counts it; the device tensors it
        writes make their first reader wait for its end, which it returns."""
        rt.occupy(self.stream, start_ns, duration, "collective")
        for prof in rt.profilers():
            prof.collective(kind, start_ns, duration, nbytes, user_location())
        end = start_ns + duration
        rt.count("collectives")
        rt.count("collective_bytes", nbytes)
        for t in written:
            if on_device(t):
                rt.awaiting[storage_ptr(t)] = end
        return end


def agree(arrival: int, all_reduce_max: Callable[[Tensor], None]) -> int:
    """The simulated time every rank starts the collective: the last one's arrival (each
    rank's in a tensor that `all_reduce_max` reduces across the group in place)."""
    t = torch.tensor([arrival], dtype=torch.int64)
    all_reduce_max(t)
    return int(t.item())


def p2p_ns(rt: runtime.Runtime, nbytes: int, same_host: bool) -> int:
    """The ns a send of nbytes to one peer lasts: over NeuronLink on one host, else EFA."""
    hosts = 1 if same_host else 2
    topology = cost_model.Topology(2, hosts, 1 if hosts == 2 else 2)
    return int(cost_model.collective_cost(rt.target, "send", nbytes, topology).ns)
