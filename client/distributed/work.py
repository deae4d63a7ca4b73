"""A collective's handle (c10d's Work): its data is in place; wait() is a simulated wait."""

from __future__ import annotations

from datetime import timedelta

import torch
from torch._C._distributed_c10d import Work as _CWork
from torch.futures import Future
from trnsim.client.core import runtime
from trnsim.client.distributed.staging import storage_ptr
from trnsim.simulator import device as sim_device

Tensor = torch.Tensor


class NeuronWork(_CWork):  # type: ignore[misc]
    """A collective's handle. Its data is in place when it is returned (gloo ran); in
    simulated time it ends at end_ns, and wait() makes the current stream wait for that."""

    def __init__(
        self,
        result: list[Tensor],
        end_ns: int,
        on_device: bool,
        start_ns: int = 0,
        arrival_ns: int = 0,
    ) -> None:
        super().__init__()
        self._result = result
        self.end_ns = end_ns  # simulated: when it ends, on every rank
        self.start_ns = start_ns  # when it starts on every rank: the last rank's arrival
        self.arrival_ns = arrival_ns  # when this rank was ready for it
        self._on_device = on_device

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self._on_device:
            rt = runtime.get()
            rt.wait_event(sim_device.Event(self.end_ns), rt.stream)
            for t in self._result:
                rt.awaiting.pop(storage_ptr(t), None)
        return True

    def block_current_stream(self) -> None:
        self.wait()

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> Future[list[Tensor]]:
        future: Future[list[Tensor]] = Future()
        future.set_result(self._result)
        return future

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def result(self) -> list[Tensor]:
        return self._result


def finished(result: list[Tensor]) -> NeuronWork:
    """The handle of a collective with nothing on the chip's timeline (CPU tensors, or none)."""
    return NeuronWork(result, 0, False)


def last(works: list[NeuronWork], outputs: list[Tensor]) -> NeuronWork:
    """One handle for coalesced collectives: the last one (they run in order on one queue)."""
    if not works:
        return finished([])
    done = works[-1]
    done._result = list(outputs)
    return done
