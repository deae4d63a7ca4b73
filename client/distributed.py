"""torch.distributed on the neuron device: the `neuron` c10d backend.

`init_process_group("neuron")` (or `"cpu:gloo,neuron:neuron"`, or no backend at all: the
accelerator's default) makes a NeuronProcessGroup. It is a Python ProcessGroup: PyTorch lets
a Python class stand for a whole group, not for one device's backend, so it takes CPU
tensors as well (straight to gloo, nothing on the timeline).

The data path is gloo's, over the host memory behind device tensors (client/memory.py), in
a gloo group this group owns: no transport here. Each collective also takes its place on
the simulated timeline of every rank:

- it waits for the work already issued on the current stream (its inputs), then runs on the
  group's collective queue, in issue order;
- the ranks agree when it starts: the last rank's arrival (one small gloo all-reduce of the
  arrival times), so it ends at the same simulated time on every rank;
- it lasts what the cost model gives for its algorithm and links (simulator/cost_model.py:
  ring or tree over NeuronLink inside a host, hierarchical over EFA across hosts);
- work.wait() makes the current stream wait for it, as with NCCL. Outputs nobody waited
  for (DDP reads its buckets through a future) make the first op that reads them wait.

Ranks are placed on hosts by NEURON_SIM_NODE, else torchrun's node rank (GROUP_RANK) when
the job spans several nodes, else the host name.
"""

from __future__ import annotations

import functools
import inspect
import zlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    ReduceScatterOptions,
)
from torch._C._distributed_c10d import Work as _CWork
from torch.futures import Future
from trnsim.client import env, runtime
from trnsim.client.errors import user_location
from trnsim.simulator import cost_model
from trnsim.simulator import device as sim_device

Tensor = torch.Tensor
NAME = "neuron"
# Stream ids of the collective queues: one per process group, clear of torch.neuron.Stream ids.
COLLECTIVE_STREAM_BASE = 1 << 20
RedOp = dist.ReduceOp.RedOpType
_GLOO_OPS = {
    RedOp.SUM: dist.ReduceOp.SUM,
    RedOp.PRODUCT: dist.ReduceOp.PRODUCT,
    RedOp.MIN: dist.ReduceOp.MIN,
    RedOp.MAX: dist.ReduceOp.MAX,
    RedOp.BAND: dist.ReduceOp.BAND,
    RedOp.BOR: dist.ReduceOp.BOR,
    RedOp.BXOR: dist.ReduceOp.BXOR,
}


class CollectiveError(RuntimeError):
    """A collective could not run: the message names the collective, the group and what to do."""


def register() -> None:
    """Called by backend.register(): `neuron` becomes a c10d backend and the default one for
    neuron tensors, and the functional collectives (DTensor, tensor parallel) get kernels."""
    dist.Backend.register_backend(NAME, _create, devices=[NAME])
    _register_functional()
    _refuse_ddp_used_map()


def _refuse_ddp_used_map() -> None:
    """DDP with find_unused_parameters or static_graph copies its map of used parameters
    through pinned host memory that PyTorch's C++ reducer asks the device backend for, which
    a Python backend cannot provide: its backward would stop on a PyTorch-internal error.
    DDP over neuron parameters refuses them at construction instead, saying what to do."""
    ddp = torch.nn.parallel.DistributedDataParallel
    original = ddp.__init__
    if getattr(original, "neuron", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs).arguments
        wanted = [k for k in ("find_unused_parameters", "static_graph") if bound.get(k)]
        module = bound.get("module")
        if (
            wanted
            and module is not None
            and any(p.device.type == NAME for p in module.parameters())
        ):
            raise NotImplementedError(
                f"DistributedDataParallel({'=True, '.join(wanted)}=True) on neuron: PyTorch's "
                f"reducer copies its map of used parameters through pinned host memory, which "
                f"only a C++ device backend can allocate. Let every parameter take part in each "
                f"step's loss, or freeze the ones a step leaves out (requires_grad_(False)), "
                f"and construct DDP without it (transformers.Trainer: "
                f"TrainingArguments(ddp_find_unused_parameters=False))"
            )
        device_ids = bound.get("device_ids")
        if (
            device_ids
            and module is not None
            and any(p.device.type == NAME for p in module.parameters())
        ):
            # accelerate passes device_ids=[local rank]: here the one core of this process,
            # neuron:0 in it. DDP over a module on one device takes none.
            kwargs.pop("device_ids", None)
            kwargs.pop("output_device", None)
            args = tuple(None if i in (1, 2) else a for i, a in enumerate(args))
        original(self, *args, **kwargs)

    __init__.neuron = True  # type: ignore[attr-defined]
    ddp.__init__ = __init__  # type: ignore[method-assign]


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> NeuronProcessGroup:
    return NeuronProcessGroup(store, rank, size, timeout)


# -- the timeline side ----------------------------------------------------------------------------
_group_ids = iter(range(1 << 20))


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
            rt.timeline.stream_wait_event(sim_device.Event(self.end_ns), rt.stream)
            for t in self._result:
                rt.awaiting.pop(_storage_ptr(t), None)
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


def _storage_ptr(t: Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def host_identity() -> str:
    """The simulated host this process is on (what decides NeuronLink or EFA)."""
    node = env.sim_node()
    return node if node is not None else env.hostname()


# -- staging: device tensors as CPU tensors gloo can take -----------------------------------------
class _Staged:
    """CPU tensors over the given tensors' memory; a non-contiguous one goes through a
    contiguous copy that is written back after the collective (back())."""

    def __init__(self) -> None:
        self._back: list[tuple[Tensor, Tensor]] = []
        self.device = False
        self.nbytes = 0

    def host(self, t: Tensor, write: bool = True, any_order: bool = False) -> Tensor:
        """t's memory as a CPU tensor gloo can take. any_order: the collective is
        elementwise (all-reduce, broadcast), so a dense tensor of another layout (a
        transposed view) goes as its memory, in memory order, as gloo takes it on CPU."""
        if t.device.type == NAME:
            self.device = True
            if not runtime.get().numerics:  # shape-only mode: priced, no data moves
                return torch.empty(0, dtype=t.dtype)
            h = runtime.get().host_alias(t)
        elif t.device.type == "cpu":
            h = t
        else:
            raise CollectiveError(
                f"the neuron process group takes neuron and CPU tensors, not {t.device.type}"
            )
        if h.is_complex():
            h = torch.view_as_real(h)
        if h.is_contiguous():
            return h
        if any_order and _dense(h):
            return h.as_strided((h.numel(),), (1,), h.storage_offset())
        c = h.contiguous()
        if write:
            self._back.append((h, c))
        return c

    def back(self) -> None:
        for h, c in self._back:
            h.copy_(c)


def _dense(t: Tensor) -> bool:
    """Whether t's elements fill a block of memory with no gaps or overlaps, in some order
    of its dimensions (a permutation of a contiguous tensor)."""
    expected = 1
    for stride, size in sorted(
        (st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def _check_same_device(tensors: Sequence[Tensor], what: str) -> None:
    kinds = {t.device.type for t in tensors}
    if len(kinds) > 1:
        raise CollectiveError(
            f"{what}: all tensors must be on one device (got {sorted(kinds)}); move them "
            f"with .to('neuron') first"
        )


class NeuronProcessGroup(dist.ProcessGroup):  # type: ignore[misc]
    """A c10d process group over gloo whose collectives are priced on the simulated chip."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
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
        _fsdp_storage_on_neuron()
        self.stream = COLLECTIVE_STREAM_BASE + next(_group_ids)
        self.hosts = self._exchange_hosts()
        self.topology = cost_model.Topology.of(self.hosts)

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

    # -- the core of every collective ------------------------------------------------------------
    def _run(self, what: str, start: Callable[[], Any]) -> None:
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
        kind: str,
        what: str,
        nbytes: int,
        result: list[Tensor],
        staged: _Staged,
        gloo_call: Callable[[], Any],
        finish: Callable[[], None] | None = None,
    ) -> NeuronWork:
        if not staged.device:  # CPU tensors: gloo alone, nothing on the chip's timeline
            self._run(what, gloo_call)
            staged.back()
            if finish is not None:
                finish()
            return NeuronWork(result, 0, False)
        rt = runtime.get()
        arrival = self._arrive(rt)
        start_ns = self._agree(arrival, what)
        if rt.numerics:  # (shape-only mode: the collective is priced and ordered, no more)
            self._run(what, gloo_call)
            staged.back()
            if finish is not None:
                finish()
        cost = cost_model.collective_cost(rt.target, kind, nbytes, self.topology)
        end = self._occupy(rt, kind, start_ns, int(cost.ns), nbytes, result)
        return NeuronWork(result, end, True, start_ns, arrival)

    def _arrive(self, rt: runtime.Runtime) -> int:
        """This rank's arrival at a collective: the recorded ops that produce its inputs run
        first, the host submits it, and it waits for the current stream and the group's
        queue."""
        rt.flush("collective")
        rt.timeline.host_work(rt.target.host_submit_ns)
        return max(rt.timeline.ready_ns(rt.stream), rt.timeline.ready_ns(self.stream))

    def _occupy(
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
        rt.timeline.occupy(self.stream, start_ns, duration, "collective")
        for prof in rt.profilers():
            prof.collective(kind, start_ns, duration, nbytes, user_location())
        end = start_ns + duration
        counts = rt.metrics.counts
        counts["collectives"] += 1
        counts["collective_bytes"] += nbytes
        for t in written:
            if t.device.type == NAME:
                rt.awaiting[_storage_ptr(t)] = end
        return end

    def _agree(self, arrival: int, what: str) -> int:
        """The simulated time every rank starts the collective: the last one's arrival."""
        t = torch.tensor([arrival], dtype=torch.int64)
        opts = AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        self._run(what, lambda: self._gloo.allreduce([t], opts))
        return int(t.item())

    def _reduce_op(self, op: Any, what: str) -> tuple[Any, float, float]:
        """gloo's op for a c10d op, with a factor to premultiply and one to divide by
        after (AVG and PREMUL_SUM, which gloo lacks)."""
        kind = op.op if hasattr(op, "op") else op
        if kind == RedOp.AVG:
            return dist.ReduceOp.SUM, 1.0, float(self._size)
        if kind == RedOp.PREMUL_SUM:
            factor = getattr(op, "factor", None)
            if not isinstance(factor, float):
                raise CollectiveError(f"{what}: PREMUL_SUM needs a Python float factor")
            return dist.ReduceOp.SUM, factor, 1.0
        if kind not in _GLOO_OPS:
            raise CollectiveError(f"{what}: reduce op {kind} is not supported")
        return _GLOO_OPS[kind], 1.0, 1.0

    @staticmethod
    def _scale(tensors: Sequence[Tensor], factor: float, divisor: float) -> None:
        for t in tensors:
            if factor != 1.0:
                t.mul_(factor)
            if divisor != 1.0:
                if t.is_floating_point() or t.is_complex():
                    t.div_(divisor)
                else:
                    t.copy_(torch.div(t, divisor, rounding_mode="floor"))

    # -- collectives ---------------------------------------------------------------------------
    def allreduce(self, tensors: list[Tensor], opts: Any = None) -> NeuronWork:  # type: ignore[override]
        opts = opts or AllreduceOptions()
        _check_same_device(tensors, "all_reduce")
        gloo_op, factor, divisor = self._reduce_op(opts.reduceOp, "all_reduce")
        staged = _Staged()
        hosts = [staged.host(t, any_order=True) for t in tensors]
        self._scale(hosts, factor, 1.0)
        gopts = AllreduceOptions()
        gopts.reduceOp = gloo_op
        return self._collective(
            "all_reduce",
            "all_reduce",
            sum(t.numel() * t.element_size() for t in tensors),
            tensors,
            staged,
            lambda: self._gloo.allreduce(hosts, gopts),
            lambda: self._scale(hosts, 1.0, divisor),
        )

    def allreduce_coalesced(self, tensors: list[Tensor], opts: Any = None) -> NeuronWork:
        one = AllreduceOptions()
        one.reduceOp = (opts or AllreduceCoalescedOptions()).reduceOp
        if not tensors:
            return NeuronWork([], 0, False)
        flat = torch.cat([t.reshape(-1) for t in tensors])
        work = self.allreduce([flat], one)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n
        work._result = tensors
        return work

    def broadcast(self, tensors: list[Tensor], opts: Any = None) -> NeuronWork:  # type: ignore[override]
        opts = opts or BroadcastOptions()
        _check_same_device(tensors, "broadcast")
        staged = _Staged()
        hosts = [staged.host(t, any_order=True) for t in tensors]
        gopts = BroadcastOptions()
        gopts.rootRank, gopts.rootTensor = opts.rootRank, opts.rootTensor
        return self._collective(
            "broadcast",
            "broadcast",
            sum(t.numel() * t.element_size() for t in tensors),
            tensors,
            staged,
            lambda: self._gloo.broadcast(hosts, gopts),
        )

    def allgather(  # type: ignore[override]
        self, outputs: list[list[Tensor]], inputs: list[Tensor], opts: Any = None
    ) -> NeuronWork:
        _check_same_device([*inputs, *(t for ol in outputs for t in ol)], "all_gather")
        staged = _Staged()
        host_in = [staged.host(t, write=False) for t in inputs]
        host_out = [[staged.host(t) for t in ol] for ol in outputs]
        flat = [t for ol in outputs for t in ol]
        return self._collective(
            "all_gather",
            "all_gather",
            sum(t.numel() * t.element_size() for t in flat),
            flat,
            staged,
            lambda: self._gloo.allgather(host_out, host_in, AllgatherOptions()),
        )

    def all_gather_single(self, output: Tensor, input: Tensor, opts: Any = None) -> NeuronWork:
        _check_same_device([output, input], "all_gather_into_tensor")
        if output.numel() != input.numel() * self._size:
            raise CollectiveError(
                f"all_gather_into_tensor: output has {output.numel()} elements; it needs "
                f"{self._size} x the input's {input.numel()}"
            )
        staged = _Staged()
        host_in = staged.host(input, write=False)
        host_out = staged.host(output)
        return self._collective(
            "all_gather",
            "all_gather_into_tensor",
            output.numel() * output.element_size(),
            [output],
            staged,
            lambda: self._gloo._allgather_base(
                host_out.reshape(-1), host_in.reshape(-1), AllgatherOptions()
            ),
        )

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None
    ) -> NeuronWork:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _last(works, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]

    def reduce_scatter(  # type: ignore[override]
        self, outputs: list[Tensor], inputs: list[list[Tensor]], opts: Any = None
    ) -> NeuronWork:
        opts = opts or ReduceScatterOptions()
        _check_same_device([*outputs, *(t for il in inputs for t in il)], "reduce_scatter")
        gloo_op, factor, divisor = self._reduce_op(opts.reduceOp, "reduce_scatter")
        staged = _Staged()
        host_in = [[staged.host(t, write=False) for t in il] for il in inputs]
        if factor != 1.0:  # (the inputs are not the caller's to change)
            host_in = [[t.clone() for t in il] for il in host_in]
            self._scale([t for il in host_in for t in il], factor, 1.0)
        host_out = [staged.host(t) for t in outputs]
        gopts = ReduceScatterOptions()
        gopts.reduceOp = gloo_op
        return self._collective(
            "reduce_scatter",
            "reduce_scatter",
            sum(t.numel() * t.element_size() for il in inputs for t in il),
            outputs,
            staged,
            lambda: self._gloo.reduce_scatter(host_out, host_in, gopts),
            lambda: self._scale(host_out, 1.0, divisor),
        )

    def reduce_scatter_single(self, output: Tensor, input: Tensor, opts: Any = None) -> NeuronWork:
        opts = opts or ReduceScatterOptions()
        _check_same_device([output, input], "reduce_scatter_tensor")
        if input.numel() != output.numel() * self._size:
            raise CollectiveError(
                f"reduce_scatter_tensor: input has {input.numel()} elements; it needs "
                f"{self._size} x the output's {output.numel()}"
            )
        gloo_op, factor, divisor = self._reduce_op(opts.reduceOp, "reduce_scatter")
        staged = _Staged()
        host_in = staged.host(input, write=False)
        if factor != 1.0:  # (the input is not the caller's to change)
            host_in = host_in.clone()
            self._scale([host_in], factor, 1.0)
        host_out = staged.host(output)
        gopts = ReduceScatterOptions()
        gopts.reduceOp = gloo_op
        return self._collective(
            "reduce_scatter",
            "reduce_scatter_tensor",
            input.numel() * input.element_size(),
            [output],
            staged,
            lambda: self._gloo._reduce_scatter_base(
                host_out.reshape(-1), host_in.reshape(-1), gopts
            ),
            lambda: self._scale([host_out], 1.0, divisor),
        )

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter_single_coalesced(
        self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None
    ) -> NeuronWork:
        works = [
            self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)
        ]
        return _last(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def all_to_all_single(
        self,
        output: Tensor,
        input: Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> NeuronWork:
        _check_same_device([output, input], "all_to_all_single")
        staged = _Staged()
        host_in = staged.host(input, write=False)
        host_out = staged.host(output)
        return self._collective(
            "all_to_all",
            "all_to_all_single",
            input.numel() * input.element_size(),
            [output],
            staged,
            lambda: self._gloo.alltoall_base(
                host_out,
                host_in,
                list(output_split_sizes),
                list(input_split_sizes),
                AllToAllOptions(),
            ),
        )

    alltoall_base = all_to_all_single  # type: ignore[assignment]

    def alltoall(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None) -> NeuronWork:
        _check_same_device([*outputs, *inputs], "all_to_all")
        staged = _Staged()
        host_in = [staged.host(t, write=False) for t in inputs]
        host_out = [staged.host(t) for t in outputs]
        return self._collective(
            "all_to_all",
            "all_to_all",
            sum(t.numel() * t.element_size() for t in inputs),
            outputs,
            staged,
            lambda: self._gloo.alltoall(host_out, host_in, AllToAllOptions()),
        )

    def barrier(self, opts: Any = None) -> NeuronWork:
        """Every rank's host waits until the last one arrives (simulated time agreed too)."""
        if not runtime.initialized():
            self._run("barrier", lambda: self._gloo.barrier(BarrierOptions()))
            return NeuronWork([], 0, False)
        rt = runtime.get()
        rt.flush("sync")
        end = self._agree(rt.timeline.now_ns(), "barrier")
        rt.timeline.synchronize()
        rt.timeline.wait_until(end)
        return NeuronWork([], end, False)

    def send(self, tensors: list[Tensor], dst: int, tag: int) -> NeuronWork:
        """The message carries the sender's ready time; the send ends when its data has
        left (the receiver's end also waits for the receiver)."""
        _check_same_device(tensors, "send")
        staged = _Staged()
        hosts = [staged.host(t, write=False) for t in tensors]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        on_device = staged.device
        rt = runtime.get() if on_device else None
        start = 0 if rt is None else self._arrive(rt)
        header = torch.tensor([start], dtype=torch.int64)
        self._run("send", lambda: self._gloo.send([header], dst, tag))
        if rt is None or rt.numerics:
            self._run("send", lambda: self._gloo.send(hosts, dst, tag))
        if rt is None:
            return NeuronWork(tensors, 0, False)
        end = self._occupy(rt, "send", start, int(self._p2p(rt, nbytes, dst)), nbytes, [])
        return NeuronWork(tensors, end, True)

    def recv(self, tensors: list[Tensor], src: int, tag: int) -> NeuronWork:
        _check_same_device(tensors, "recv")
        staged = _Staged()
        hosts = [staged.host(t) for t in tensors]
        header = torch.zeros(1, dtype=torch.int64)
        rt = runtime.get() if staged.device else None
        ready = 0 if rt is None else self._arrive(rt)
        self._run("recv", lambda: self._gloo.recv([header], src, tag))
        if rt is None or rt.numerics:
            self._run("recv", lambda: self._gloo.recv(hosts, src, tag))
            staged.back()
        if rt is None:
            return NeuronWork(tensors, 0, False)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        start = max(ready, int(header.item()))
        end = self._occupy(rt, "recv", start, int(self._p2p(rt, nbytes, src)), nbytes, tensors)
        return NeuronWork(tensors, end, True)

    def _p2p(self, rt: runtime.Runtime, nbytes: int, peer: int) -> float:
        hosts = 1 if self.hosts[peer] == self.hosts[self._rank] else 2
        topology = cost_model.Topology(2, hosts, 1 if hosts == 2 else 2)
        return cost_model.collective_cost(rt.target, "send", nbytes, topology).ns

    # reduce, gather and scatter: gloo's, over staged tensors, priced as their mirror images.
    def reduce(self, tensors: list[Tensor], opts: Any) -> NeuronWork:  # type: ignore[override]
        gloo_op, factor, divisor = self._reduce_op(opts.reduceOp, "reduce")
        staged = _Staged()
        hosts = [staged.host(t) for t in tensors]
        self._scale(hosts, factor, 1.0)
        gopts = type(opts)()
        gopts.reduceOp, gopts.rootRank, gopts.rootTensor = gloo_op, opts.rootRank, opts.rootTensor
        root = opts.rootRank
        return self._collective(
            "broadcast",
            "reduce",
            sum(t.numel() * t.element_size() for t in tensors),
            tensors,
            staged,
            lambda: self._gloo.reduce(hosts, gopts),
            lambda: self._scale(hosts, 1.0, divisor) if self._rank == root else None,
        )

    def gather(self, outputs: list[list[Tensor]], inputs: list[Tensor], opts: Any) -> NeuronWork:  # type: ignore[override]
        staged = _Staged()
        host_in = [staged.host(t, write=False) for t in inputs]
        host_out = [[staged.host(t) for t in ol] for ol in outputs]
        flat = [t for ol in outputs for t in ol]
        nbytes = sum(t.numel() * t.element_size() for t in inputs) * self._size
        return self._collective(
            "all_gather",
            "gather",
            nbytes,
            flat,
            staged,
            lambda: self._gloo.gather(host_out, host_in, opts),
        )

    def scatter(self, outputs: list[Tensor], inputs: list[list[Tensor]], opts: Any) -> NeuronWork:  # type: ignore[override]
        staged = _Staged()
        host_out = [staged.host(t) for t in outputs]
        host_in = [[staged.host(t, write=False) for t in il] for il in inputs]
        nbytes = sum(t.numel() * t.element_size() for t in outputs) * self._size
        return self._collective(
            "reduce_scatter",
            "scatter",
            nbytes,
            outputs,
            staged,
            lambda: self._gloo.scatter(host_out, host_in, opts),
        )


def _fsdp_storage_on_neuron() -> None:
    """FSDP2 frees an unsharded parameter by resizing its storage to 0 bytes and brings it
    back by resizing it again, which PyTorch lets only C++ backends implement. For neuron
    tensors its two helpers return the storage's HBM to the allocator and take it again
    (Runtime.park/unpark): the memory accounting is FSDP's, the bytes stay on the host."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    except ImportError:  # (a torch without FSDP2)
        return
    if getattr(_fsdp_param.free_storage, "neuron", False):
        return
    free, alloc = _fsdp_param.free_storage, _fsdp_param.alloc_storage

    def free_storage(tensor: Tensor) -> None:
        if tensor.device.type != NAME:
            return free(tensor)
        runtime.get().park(tensor.untyped_storage())
        return None

    def alloc_storage(tensor: Tensor) -> None:
        if tensor.device.type != NAME:
            return alloc(tensor)
        storage = tensor.untyped_storage()
        if storage.nbytes() < tensor.numel() * tensor.itemsize:
            raise CollectiveError(
                f"FSDP asked a neuron storage of {storage.nbytes()} bytes to grow to "
                f"{tensor.numel() * tensor.itemsize}; neuron storages cannot grow in place"
            )
        runtime.get().unpark(storage)
        return None

    free_storage.neuron = alloc_storage.neuron = True  # type: ignore[attr-defined]
    _fsdp_param.free_storage = free_storage
    _fsdp_param.alloc_storage = alloc_storage
    _fsdp_param_group.alloc_storage = alloc_storage


def _last(works: list[NeuronWork], outputs: list[Tensor]) -> NeuronWork:
    """One handle for coalesced collectives: the last one (they run in order on one queue)."""
    if not works:
        return NeuronWork([], 0, False)
    last = works[-1]
    last._result = list(outputs)
    return last


# -- functional collectives (DTensor, tensor parallel) ---------------------------------------------
def _register_functional() -> None:
    """PyTorch's functional collectives call a group's all_gather_single and friends from
    C++, which a Python group cannot override: kernels for neuron tensors call the group
    here instead (all_reduce and broadcast reach the group's own methods from C++)."""
    lib = torch.library.Library("_c10d_functional", "IMPL")
    resolve = dist.distributed_c10d._resolve_process_group
    register_work = torch._C._distributed_c10d._register_work

    def group(name: str) -> NeuronProcessGroup:
        pg = resolve(name)  # type: ignore[arg-type]
        if not isinstance(pg, NeuronProcessGroup):
            raise CollectiveError(
                f"a functional collective on neuron tensors needs a neuron process group; "
                f"group {name!r} is {type(pg).__name__}. Use init_process_group('neuron')"
            )
        return pg

    def all_gather_into_tensor(t: Tensor, group_size: int, group_name: str) -> Tensor:
        out = t.new_empty((t.shape[0] * group_size, *t.shape[1:]))
        register_work(out, group(group_name).all_gather_single(out, t.contiguous()))
        return out

    def all_gather_into_tensor_out(
        t: Tensor, group_size: int, group_name: str, *, out: Tensor
    ) -> Tensor:
        register_work(out, group(group_name).all_gather_single(out, t.contiguous()))
        return out

    def all_gather_into_tensor_coalesced(
        ts: list[Tensor], group_size: int, group_name: str
    ) -> list[Tensor]:
        return [all_gather_into_tensor(t, group_size, group_name) for t in ts]

    def _rs_opts(reduce_op: str) -> ReduceScatterOptions:
        opts = ReduceScatterOptions()
        opts.reduceOp = _functional_op(reduce_op)
        return opts

    def reduce_scatter_tensor(
        t: Tensor, reduce_op: str, group_size: int, group_name: str
    ) -> Tensor:
        out = t.new_empty((t.shape[0] // group_size, *t.shape[1:]))
        pg = group(group_name)
        register_work(out, pg.reduce_scatter_single(out, t.contiguous(), _rs_opts(reduce_op)))
        return out

    def reduce_scatter_tensor_out(
        t: Tensor, reduce_op: str, group_size: int, group_name: str, *, out: Tensor
    ) -> Tensor:
        pg = group(group_name)
        register_work(out, pg.reduce_scatter_single(out, t.contiguous(), _rs_opts(reduce_op)))
        return out

    def reduce_scatter_tensor_coalesced(
        ts: list[Tensor], reduce_op: str, group_size: int, group_name: str
    ) -> list[Tensor]:
        return [reduce_scatter_tensor(t, reduce_op, group_size, group_name) for t in ts]

    def all_to_all_single(
        t: Tensor, output_split_sizes: list[int], input_split_sizes: list[int], group_name: str
    ) -> Tensor:
        rows = sum(output_split_sizes) if output_split_sizes else t.shape[0]
        out = t.new_empty((rows, *t.shape[1:]))
        pg = group(group_name)
        register_work(
            out,
            pg.all_to_all_single(out, t.contiguous(), output_split_sizes, input_split_sizes),
        )
        return out

    kernels: dict[str, Callable[..., Any]] = {
        "all_gather_into_tensor": all_gather_into_tensor,
        "all_gather_into_tensor_out": all_gather_into_tensor_out,
        "all_gather_into_tensor_coalesced": all_gather_into_tensor_coalesced,
        "reduce_scatter_tensor": reduce_scatter_tensor,
        "reduce_scatter_tensor_out": reduce_scatter_tensor_out,
        "reduce_scatter_tensor_coalesced": reduce_scatter_tensor_coalesced,
        "all_to_all_single": all_to_all_single,
    }
    for name, fn in kernels.items():
        lib.impl(name, fn, "PrivateUse1")
    _functional_state["lib"] = lib


_functional_state: dict[str, Any] = {}


def _functional_op(name: str) -> Any:
    ops = {
        "sum": dist.ReduceOp.SUM,
        "avg": dist.ReduceOp.AVG,
        "product": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
    }
    if name.lower() not in ops:
        raise CollectiveError(f"functional collective reduce op {name!r} is not supported")
    return ops[name.lower()]
