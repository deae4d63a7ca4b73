"""torch.neuron: the device module, shaped like torch.cuda."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from trnsim.client.api import streams
from trnsim.client.api.device_base import DeviceLike
from trnsim.client.api.device_base import check_index as _check_index
from trnsim.client.api.device_base import flushed as _flushed
from trnsim.client.core import runtime
from trnsim.simulator.memory import format_bytes

if TYPE_CHECKING:
    from trnsim.client.api.explain import Report
    from trnsim.client.core import profiler
    from trnsim.client.modes.compiled import Explained
    from trnsim.compiler.graph import KernelCost


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return runtime.initialized()


def _is_in_bad_fork() -> bool:
    return False


def init() -> None:
    runtime.get()


def device_count() -> int:
    """One simulated core per process (chosen by LOCAL_RANK / NEURON_RT_VISIBLE_CORES)."""
    return 1


def current_device() -> int:
    return 0


def set_device(device: DeviceLike) -> None:
    from trnsim.client.core.errors import check_device_index

    check_device_index(
        torch.device(device) if not isinstance(device, int) else torch.device("neuron", device)
    )


class device:
    """Context manager selecting the device: only neuron:0 exists in a process."""

    def __init__(self, device: DeviceLike) -> None:
        set_device(device)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def get_device_name(device: DeviceLike | None = None) -> str:
    rt = runtime.get()
    return f"simulated {rt.target.name} NeuronCore ({rt.target.generation}) core {rt.core}"


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Always: bfloat16 is the NeuronCore's native matmul type (autocast's default here)."""
    return True


@dataclasses.dataclass(frozen=True)
class NeuronDeviceProperties:
    """What torch.cuda.get_device_properties gives, for one simulated NeuronCore (a device
    is one core). The figures are the simulated target's (docs/chip.md)."""

    name: str
    neuron_core_version: str  # "NeuronCore-v3" on trn2
    major: int  # the NeuronCore version: 3 on trn2, 2 on trn1
    minor: int
    total_memory: int  # this core's share of the chip's HBM, bytes
    multi_processor_count: int  # compute engines: Tensor, Vector, Scalar, GpSimd
    engines: tuple[str, ...]
    sbuf_bytes: int
    psum_bytes: int
    hbm_gbps: float
    cores_per_chip: int
    peak_bf16_tflops: float
    peak_fp32_tflops: float

    def __repr__(self) -> str:
        return (
            f"NeuronDeviceProperties(name={self.name!r}, major={self.major}, "
            f"minor={self.minor}, total_memory={self.total_memory >> 20}MB, "
            f"engines={len(self.engines)}, sbuf={self.sbuf_bytes >> 20}MB)"
        )


_ENGINES = ("tensor", "vector", "scalar", "gpsimd")


def get_device_properties(device: DeviceLike | None = None) -> NeuronDeviceProperties:
    _check_index(device)
    t = runtime.get().target
    return NeuronDeviceProperties(
        name=f"Trainium ({t.name}) NeuronCore",
        neuron_core_version=t.generation,
        major=_core_version(t.generation),
        minor=0,
        total_memory=t.hbm_bytes,
        multi_processor_count=len(_ENGINES),
        engines=_ENGINES,
        sbuf_bytes=t.sbuf_bytes,
        psum_bytes=t.psum_bytes,
        hbm_gbps=t.hbm_gbps,
        cores_per_chip=t.cores_per_chip,
        peak_bf16_tflops=t.peak_bf16_tflops,
        peak_fp32_tflops=t.peak_fp32_tflops,
    )


def _core_version(generation: str) -> int:
    digits = generation.rpartition("-v")[2]
    return int(digits) if digits.isdigit() else 0


def get_device_capability(device: DeviceLike | None = None) -> tuple[int, int]:
    """(major, minor): the NeuronCore version, (3, 0) on trn2, (2, 0) on trn1."""
    p = get_device_properties(device)
    return p.major, p.minor


def synchronize(device: DeviceLike | None = None) -> None:
    """Waits (in simulated time) until every queue of the core is empty."""
    runtime.get().synchronize()


# -- memory -----------------------------------------------------------------------------------
def memory_allocated(device: DeviceLike | None = None) -> int:
    return _flushed().memory.allocated_bytes()


def max_memory_allocated(device: DeviceLike | None = None) -> int:
    return _flushed().memory.peak_allocated_bytes()


def memory_reserved(device: DeviceLike | None = None) -> int:
    return _flushed().memory.reserved_bytes()


def max_memory_reserved(device: DeviceLike | None = None) -> int:
    return _flushed().memory.memory_stats()["peak_reserved_bytes"]


def memory_stats(device: DeviceLike | None = None) -> dict[str, int]:
    s = _flushed().memory.memory_stats()
    return {
        "allocated_bytes.all.current": s["allocated_bytes"],
        "allocated_bytes.all.peak": s["peak_allocated_bytes"],
        "reserved_bytes.all.current": s["reserved_bytes"],
        "reserved_bytes.all.peak": s["peak_reserved_bytes"],
        "requested_bytes.all.current": s["requested_bytes"],
        "inactive_split_bytes.all.current": s["inactive_split_bytes"],
        "num_alloc_retries": s["num_cache_flushes"],
        "num_ooms": s["num_ooms"],
        "allocation.all.allocated": s["num_allocs"],
        "allocation.all.freed": s["num_frees"],
        "segment.all.allocated": s["num_segment_allocs"],
        "segment.all.freed": s["num_segment_frees"],
        "capacity_bytes": s["capacity_bytes"],
    }


def reset_peak_memory_stats(device: DeviceLike | None = None) -> None:
    runtime.get().memory.reset_peak_stats()


def reset_accumulated_memory_stats(device: DeviceLike | None = None) -> None:
    runtime.get().memory.reset_accumulated_stats()


def empty_cache() -> None:
    runtime.get().memory.empty_cache()


def mem_get_info(device: DeviceLike | None = None) -> tuple[int, int]:
    rt = runtime.get()
    capacity = rt.memory.memory_capacity()
    return capacity - rt.memory.reserved_bytes(), capacity


def set_per_process_memory_fraction(fraction: float, device: DeviceLike | None = None) -> None:
    """Caps the memory this process may reserve on the core at fraction × its HBM: an
    allocation past it frees cached blocks and retries, then raises torch.OutOfMemoryError
    (as torch.cuda's does)."""
    if not isinstance(fraction, float):
        raise TypeError(f"Invalid type for fraction argument, must be `float`, got {fraction!r}")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _check_index(device)
    rt = runtime.get()
    rt.memory.set_memory_limit(int(rt.memory.memory_capacity() * fraction))


def get_per_process_memory_fraction(device: DeviceLike | None = None) -> float:
    _check_index(device)
    rt = runtime.get()
    return rt.memory.memory_limit() / rt.memory.memory_capacity()


def memory_snapshot() -> list[dict[str, object]]:
    """The allocator's segments and their blocks (torch.cuda.memory_snapshot's layout;
    addresses are offsets in the core's simulated HBM)."""
    return _flushed().memory.memory_snapshot()


def memory_summary(device: DeviceLike | None = None, abbreviated: bool = False) -> str:
    """A table of the caching allocator's state, in torch.cuda.memory_summary's manner."""
    _check_index(device)
    rt = _flushed()
    s = rt.memory.memory_stats()

    rows = [
        (
            "Allocated memory",
            format_bytes(s["allocated_bytes"]),
            format_bytes(s["peak_allocated_bytes"]),
        ),
        ("Requested memory", format_bytes(s["requested_bytes"]), "-"),
        (
            "Reserved memory",
            format_bytes(s["reserved_bytes"]),
            format_bytes(s["peak_reserved_bytes"]),
        ),
        ("Non-releasable memory", format_bytes(s["inactive_split_bytes"]), "-"),
        ("Cached (free) memory", format_bytes(s["cached_bytes"]), "-"),
        ("Segments", str(s["segments"]), "-"),
    ]
    width = 75
    lines = [
        "=" * width,
        f" trnsim simulated HBM memory summary, device ID {rt.core:<4d}".ljust(width),
        "-" * width,
        (
            f" capacity {format_bytes(s['capacity_bytes'])}, limit {format_bytes(rt.memory.memory_limit())}; "
            f"OOMs: {s['num_ooms']}, cache flushes: {s['num_cache_flushes']}"
        ),
        "=" * width,
        f" {'Metric':<26}| {'Cur Usage':>20} | {'Peak Usage':>20} ",
        "-" * width,
        *(f" {name:<26}| {cur:>20} | {peak:>20} " for name, cur, peak in rows),
        "-" * width,
        f" {'Allocations':<26}| {s['num_allocs']:>10} allocated | {s['num_frees']:>14} freed ",
        (
            f" {'Segment allocations':<26}| {s['num_segment_allocs']:>10} allocated | "
            f"{s['num_segment_frees']:>14} freed "
        ),
        "=" * width,
    ]
    return "\n".join(lines) + "\n"


_busy_mark: dict[str, int] = {}


def utilization(device: DeviceLike | None = None) -> int:
    """Percent of the simulated time since the last call (or since the runtime started)
    during which the core's queues were running work (torch.cuda.utilization's meaning,
    on the simulated clock: deterministic). Busy time is summed over streams, so work
    overlapping on several streams counts more than once (capped at 100)."""
    _check_index(device)
    rt = _flushed()
    busy, now = rt.device_busy_ns(), rt.now_ns()
    last_busy, last_now = _busy_mark.get("busy", 0), _busy_mark.get("now", 0)
    if busy < last_busy or now < last_now:  # reset_metrics() or a new runtime
        last_busy, last_now = 0, 0
    _busy_mark.update(busy=busy, now=now)
    span = now - last_now
    return 0 if span <= 0 else min(100, round(100 * (busy - last_busy) / span))


# -- random numbers ---------------------------------------------------------------------------
def manual_seed(seed: int) -> None:
    _flushed().generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    # torch.manual_seed calls this; never call back into torch.manual_seed from here.
    manual_seed(seed)


def seed() -> None:
    _flushed().generator.seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return runtime.get().generator.initial_seed()


def get_rng_state(device: DeviceLike | None = None) -> torch.Tensor:
    return _flushed().generator.get_state()


def set_rng_state(state: torch.Tensor, device: DeviceLike | None = None) -> None:
    _flushed().generator.set_state(state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    set_rng_state(states[0])


# -- streams and events: torch.cuda's, as torch.neuron's own names (client/api/streams.py) ------
Stream = streams.Stream
Event = streams.Event
default_stream = streams.default_stream
current_stream = streams.current_stream
set_stream = streams.set_stream
stream = streams.stream


# -- execution mode ---------------------------------------------------------------------------
def set_eager_mode(mode: str) -> None:
    """ "eager" (each op its own launch) or "adaptive" (recorded graphs, fused when they
    recur); the default comes from NEURON_EAGER. Whatever was recorded runs first."""
    runtime.get().set_mode(mode)


def get_eager_mode() -> str:
    return str(runtime.get().mode)


# -- counters ---------------------------------------------------------------------------------
def metrics() -> dict[str, int]:
    """Counters and simulated times (ns): ops, compiles, cache hits, launches, sync waits,
    device busy per engine, host time. Reset with reset_metrics()."""
    return runtime.get().snapshot()


def register_kernel(op: object, cost: Callable[..., KernelCost]) -> None:
    """Makes a torch.library.custom_op one neuron kernel with a declared cost (client/api/kernels.py)."""
    from trnsim.client.api import kernels

    kernels.register_kernel(op, cost)


def __getattr__(name: str) -> type[KernelCost]:
    if name == "KernelCost":  # torch.neuron.KernelCost(engine, ns, flops, hbm_bytes)
        from trnsim.compiler.graph import KernelCost

        return KernelCost
    raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")


def explain() -> Report:
    """Why the runtime did what it did, at your lines: adaptive mode's graph cuts (reason,
    the op the graph ended with, file:line), compiled mode's graph breaks, recompiles and
    eager fallbacks. print() it for a table; .to_json() for data (client/api/explain.py)."""
    from trnsim.client.api import explain as explaining

    return explaining.explain()


def metrics_report() -> str:
    """The counters as a readable summary: ops and executables, adaptive and compiled mode,
    memory traffic, and the simulated clocks. Every time is simulated, in ms: compile wait
    (compile_wait_ns), sync waits (sync_wait_ns), wall (wall_ns: the later of the host and
    the device), host busy (host_busy_ns), device busy (device_busy_ns, summed over
    streams)."""
    m = metrics()
    ms = {k: v / 1e6 for k, v in m.items() if k.endswith("_ns")}
    rows = [*_work_rows(m, ms), *_traffic_rows(m, ms)]
    lines = [f"{name:<18}{text}" for name, text in rows]
    return "\n".join(lines)


def _work_rows(m: dict[str, int], ms: dict[str, float]) -> list[tuple[str, str]]:
    """metrics_report's rows of what ran: ops, executables, adaptive and compiled mode."""
    cuts = ", ".join(
        f"{k[len('cut_') :]} {v}" for k, v in sorted(m.items()) if k.startswith("cut_") and v
    )
    return [
        (
            "ops dispatched",
            (
                f"{m['ops_dispatched']} ({m['view_ops']} views), signature cache hits "
                f"{m['cache_hits']}, misses {m['cache_misses']}"
            ),
        ),
        (
            "executables",
            (
                f"{m['executables_compiled']} compiled, {m['executables_fetched']} fetched from "
                f"the daemon's cache; compile wait {ms['compile_wait_ns']:.3f} ms"
            ),
        ),
        (
            "adaptive",
            (
                f"{m['graphs_formed']} graphs: {m['fused_executions']} fused runs "
                f"({m['fused_ops']} ops), {m['op_by_op_graphs']} op by op; "
                f"{m['fused_graphs_fetched']} fetched at first sight; fused compiles "
                f"{m['fused_compiles_ready']}/{m['fused_compiles_requested']} ready, "
                f"{m['fused_compiles_failed']} failed; cuts: {cuts or 'none'}"
            ),
        ),
        (
            "compiled",
            (
                f"{m['compiled_dynamo_graphs']} dynamo graphs, {m['compiled_calls']} region runs, "
                f"{m['compiled_fallbacks']} eager fallbacks"
            ),
        ),
    ]


def _traffic_rows(m: dict[str, int], ms: dict[str, float]) -> list[tuple[str, str]]:
    """metrics_report's rows of memory traffic, launches and the simulated clocks."""
    return [
        (
            "memory traffic",
            (
                f"HBM {m['hbm_bytes']} B; host->device {m['h2d_bytes']} B, device->host "
                f"{m['d2h_bytes']} B"
            ),
        ),
        (
            "launches",
            (
                f"{m.get('launches', 0)}; sync waits {m.get('sync_waits', 0)} "
                f"({ms.get('sync_wait_ns', 0.0):.3f} ms)"
            ),
        ),
        (
            "simulated clocks",
            (
                f"wall {ms.get('wall_ns', 0.0):.3f} ms, host busy {ms.get('host_busy_ns', 0.0):.3f} "
                f"ms, device busy {ms.get('device_busy_ns', 0.0):.3f} ms"
            ),
        ),
    ]


def compiled_explain() -> list[Explained]:
    """Why torch.compile(backend="neuron") recompiled: per function, the guard failures."""
    from trnsim.client.modes import compiled

    return compiled.explain()


@contextlib.contextmanager
def profile(path: str | None = None) -> Iterator[profiler.Profiler]:
    """Profiles the block: each launch on the simulated chip and each instruction of it on
    its engine, named by its ATen ops and source lines, and each collective (client/
    profiler.py). Yields the profiler (.summary() is a table, .events the trace). What was
    recorded before the block runs first; the block's work runs at its end, then the trace
    is written to `path` (Chrome trace JSON: ui.perfetto.dev) if given."""
    from trnsim.client.core import profiler

    rt = runtime.get()
    rt.flush("profile")
    previous = rt.profiler
    prof = rt.profiler = profiler.Profiler(path, rt.core)
    try:
        yield prof
        rt.flush("profile")
    finally:
        rt.profiler = previous
        if previous is not None:
            previous.events.extend(prof.events)
    prof.write()


def reset_metrics() -> None:
    """Counters and busy times back to zero; the simulated clocks go on."""
    runtime.get().reset_metrics()
