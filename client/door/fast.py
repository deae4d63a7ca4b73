"""The C++ door (fast_door.cpp): PyTorch's PrivateUse1 kernel of the ops the Python door
serves, which serves warm eager calls itself and hands every other call on to Python.

A warm eager call of an op that returns new tensors (add, mm, silu, layer_norm, topk,
cat...), of an in-place op writing its first argument (add_, mul_, zero_, copy_...), of a
view op, of `empty` or of a copy between neuron tensors costs the Python door a dozen
Python steps of about a microsecond each (docs/host-time.md). The C++ door keys the call by
its signature without converting it to Python objects and, for a signature Python has
offered (`offer`, from eager mode's hot path), runs the CPU's kernel over host aliases
itself. Python keeps the counters, the HBM blocks and its record of each output's memory,
in one short call (`_served`, `_served_many`, `_made`; an in-place op's `_may_write` before
its kernel runs), and answers with the stream the door launches the call on, on the
runtime's C++ timeline (simulator/accounting.h; Python makes the launch itself when a
profiler wants its source line: `_wrote` for an in-place op). An output's storage gives its
block back through that record when it dies. So simulated time, memory and counters are
the Python door's. Anything else (recording modes,
shape-only runs, collectives awaited, shapes being recorded, an op that fails) goes
through the Python door as before.

The door is built from its source on first use (simulator/native.py's builder: g++ and
ninja, about 40 s, once per machine and source) into ~/.cache/trnsim/door/<source hash>,
and loaded from there after. NEURON_FAST_DOOR=off keeps every op on the Python door, while
device memory is still made and adopted by the door's C++ (client/core/memory.py), so
that memory is accounted alike either way. If the door cannot be built the Python door
serves everything, with one warning (and device memory is imported through DLPack).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import torch
from trnsim.client.core import env, runtime, shapes
from trnsim.client.core.device_memory import native_adopt
from trnsim.client.core.errors import execution_error
from trnsim.client.core.memory import native_device_of
from trnsim.client.core.ops import FRESH, NONE, WRITE, Entry, OpSpec
from trnsim.client.core.types import Args, Kwargs
from trnsim.simulator import native
from trnsim.simulator.shape_only import NUMERICS

# (the door, and the accounting it shares with the simulator: simulator/accounting.h)
SOURCES = (
    Path(__file__).with_name("fast_door.cpp"),
    Path(native.__file__).with_name("accounting.h"),
)
CPU = torch.device("cpu")
NAME = "trnsim_door"
ENV = env.NEURON_FAST_DOOR

_module: ModuleType | None = None
_tried = False
_on = [False]  # whether the C++ door looks signatures up (set_on)
_suspended = [False]  # python_door_only: every op takes the Python door until resumed


def enabled() -> bool:
    """Whether NEURON_FAST_DOOR allows the C++ door (client/core/env.py)."""
    return env.fast_door()


def load(build: bool = True) -> ModuleType | None:
    """The C++ door's module: loaded if built, else built now (when `build`); None when
    NEURON_FAST_DOOR is off or it cannot be built (a warning says why, once)."""
    global _module, _tried
    if _module is not None or _tried:
        return _module
    _tried = True
    try:
        serve = enabled()
    except env.ConfigError as e:
        warnings.warn(f"{e}; the C++ door stays off", RuntimeWarning, stacklevel=2)
        serve = False
    try:
        module = native.load_built(NAME, "door", SOURCES, _build, ("g++", "ninja"), build)
    except native.NativeBuildError as e:
        warnings.warn(
            f"{e} Until then every op takes the Python door, which costs several "
            f"microseconds more per op.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    if module is None:
        _tried = False  # (not built, and not asked to build: a later call may)
        return None
    use_native_memory(module)  # (with the door off too: memory made as it makes it)
    _module = module if serve else None
    return _module


def _build(where: Path, built: Path) -> None:
    """The door, by torch's extension builder (ninja), with the simulator's accounting
    header on its include path."""
    from torch.utils.cpp_extension import load as build_extension

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_extension(
            NAME,
            [str(SOURCES[0])],
            extra_cflags=["-O2"],
            extra_include_paths=[str(SOURCES[1].parent)],
            build_directory=str(where),
            is_python_module=True,
            verbose=False,
        )


def module() -> ModuleType | None:
    """The door's module once loaded (None: every op takes the Python door)."""
    return _module


# -- what the C++ door calls back -----------------------------------------------------------------
# _served and _served_many answer None when the Python door must take the call now, else
# the launch's stream (the C++ door launches it there on the runtime's timeline,
# simulator/accounting.h), or LAUNCHED (Python made it), and the records of the outputs'
# memory (DeviceMemory.adopted), which each output's storage hands back to
# DeviceMemory._release when it dies. _may_write answers REFUSED, LAUNCHED (_wrote makes
# it) or the stream.
REFUSED = -2
LAUNCHED = -1
Records = tuple[int, object] | None


def _served(token: tuple[runtime.Runtime, Entry], host: torch.Tensor, ptr: int) -> Records:
    """A warm call of the token's signature, computed in C++ (`host`, the CPU's result,
    whose memory the output is, at `ptr`): None if the Python door must take the call now,
    else accounted as eager.run accounts it (its counters and HBM block) but for its
    launch, which _launch answers."""
    rt, entry = token
    if not _counted(rt):
        return None
    memory = rt.memory
    block = memory.allocate(entry.one_fresh_output)  # type: ignore[arg-type]
    return _launch(rt, entry), memory.adopted(ptr, block, host)


def _served_many(
    token: tuple[runtime.Runtime, Entry],
    hosts: tuple[torch.Tensor | None, ...],
    ptrs: tuple[int | None, ...],
) -> Records:
    """_served() of an op returning several new tensors (layer_norm's output, mean and
    rstd), and perhaps Nones (an output_mask's False): a block for each tensor, allocated in
    order as eager mode allocates them, one launch."""
    rt, entry = token
    if not _counted(rt):
        return None
    memory = rt.memory
    blocks = memory.allocate_each([r.nbytes if r.kind is FRESH else None for r in entry.returns])
    records = tuple(
        None if block is None else memory.adopted(ptr, block, host)  # type: ignore[arg-type]
        for block, ptr, host in zip(blocks, ptrs, hosts, strict=True)
    )
    return _launch(rt, entry), records


def _launch(rt: runtime.Runtime, entry: Entry) -> int:
    """A served call's launch: left to the C++ door, which makes it as Runtime.launch does
    (the stream it goes on), unless a profiler wants its source line or host time is
    measured: then made here (LAUNCHED)."""
    if rt.door_launches():
        return rt.stream
    rt.launch(entry.loaded)  # type: ignore[arg-type]
    return LAUNCHED


def _made(host: torch.Tensor, ptr: int, nbytes: int) -> tuple[object, object] | None:
    """An empty tensor made in C++ (`host`, its CPU memory, at `ptr`): None if the Python
    door must make it now, else accounted as the Python door's `empty` accounts it
    (counted, and an HBM block of `nbytes`): the release its storage calls when it dies,
    with the record returned."""
    rt = runtime._runtime
    if rt is None or not _direct_kernels[0] or not _eager(rt):
        return None
    rt.counts["ops_dispatched"] += 1
    memory = rt.memory
    return memory._release, memory.adopted(ptr, memory.allocate(nbytes), host)


_direct_kernels = [False]  # whether client/api/backend.py has registered its direct kernels


def direct_kernels_registered() -> None:
    """The Python door's direct kernels are registered (on its first op, which must be
    Python's: an `empty` the C++ door made before would leave mm to its composite)."""
    _direct_kernels[0] = True


def _may_write(token: tuple[runtime.Runtime, Entry]) -> int:
    """A warm call of an in-place op, about to be computed in C++ into its first argument's
    memory: REFUSED if the Python door must take the call (nothing is written yet), else
    counted as eager mode counts it; its launch, once written, is the C++ door's on the
    stream returned, or (LAUNCHED) _wrote's."""
    rt = token[0]
    if not _counted(rt):
        return REFUSED
    return rt.stream if rt.door_launches() else LAUNCHED


def _wrote(token: tuple[runtime.Runtime, Entry]) -> None:
    """The in-place op _may_write let through has written its first argument: its launch,
    when Python makes it (a profiler wants its source line)."""
    rt, entry = token
    rt.launch(entry.loaded)  # type: ignore[arg-type]


_ERRORS: dict[str, type[Exception]] = {
    "IndexError": IndexError,
    "ValueError": ValueError,
    "TypeError": TypeError,
    "NotImplementedError": NotImplementedError,
    "OutOfMemoryError": torch.OutOfMemoryError,
}


def _failed(token: tuple[runtime.Runtime, Entry], kind: str, message: str) -> NoReturn:
    """The kernel of an in-place op _may_write let through failed (it may have written part
    of its argument): the error the Python door raises, which runs no op twice."""
    step = token[1].loaded.steps[0]  # type: ignore[union-attr]
    raise execution_error(step.name, _ERRORS.get(kind, RuntimeError)(message))


def _counted(rt: runtime.Runtime) -> bool:
    """Whether the Python door would run a call of this runtime's eager mode now as the C++
    door did (no collective output awaited, and _eager); if so, counted as the Python door
    counts a signature cache hit."""
    if rt is not runtime._runtime or rt.awaiting or not _eager(rt):
        return False
    counts = rt.counts
    counts["ops_dispatched"] += 1
    counts["cache_hits"] += 1
    return True


def _eager(rt: runtime.Runtime) -> bool:
    """The runtime runs ops as eager mode does, one by one and computed: no recording takes
    them, numerics on, no shapes recorded (what the C++ door is on for)."""
    return rt.recorder is None and rt.numerics and shapes.active is None and NUMERICS.on


def _view() -> bool:
    """A view op, about to be made by the Meta kernel in C++: False if the Python door must
    take it (a recording wants it), else counted as the Python door counts it."""
    rt = runtime._runtime
    if rt is None or shapes.active is not None:
        return False
    recorder = rt.recorder
    if recorder is not None and recorder.pending:
        return False
    counts = rt.counts
    counts["ops_dispatched"] += 1
    counts["view_ops"] += 1
    return True


def use_native_memory(door: ModuleType) -> None:
    """Device memory is made and adopted by the C++ door from now on (client/core/memory.py,
    device_memory.py), whether or not it serves calls: no Python storage object per tensor."""
    native_device_of[:] = [door.device_of]
    native_adopt[:] = [door.adopt]


def install(door: ModuleType) -> None:
    door.install(_served, _served_many, _may_write, _wrote, _failed, _view, _made)
    door.install_guard()
    door.set_on(True)
    _on[0] = True


_last_runtime: list[weakref.ref[runtime.Runtime]] = []


def mode_set(rt: runtime.Runtime) -> None:
    """The runtime's mode (or recorder) was set: the C++ door looks signatures up only in
    eager mode with numerics on (a recording takes every op; shape-only runs compute
    nothing). A new runtime starts with an empty table (the old one's entries would be
    refused one by one, and keep the old runtime alive)."""
    door = _module
    if door is None:
        return
    if not _last_runtime or _last_runtime[0]() is not rt:
        door.clear()
        _last_runtime[:] = [weakref.ref(rt)]
    set_on(_eager(rt))


# -- what the Python door offers ----------------------------------------------------------------
def offer(
    rt: runtime.Runtime,
    spec: OpSpec,
    entry: Entry,
    args: Args,
    kwargs: Kwargs,
    tensors: list[torch.Tensor],
    scalars: list[float],
) -> None:
    """Eager mode ran this call of the entry (new tensors out, or its first argument written
    in place): may the C++ door serve its signature from now on? Decided once per entry
    (entry.fast)."""
    door = _module
    if door is None or not NUMERICS.on:
        return
    if not _on[0] and not _suspended[0] and rt is runtime._runtime and _eager(rt):
        set_on(True)  # (back in eager mode on a runtime swapped in after another's mode)
    fast = entry.fast
    if fast is None:
        fast = entry.fast = _servable(spec, entry, args, kwargs, tensors, scalars)
    if fast:
        if entry.one_fresh_output or several_fresh(entry):
            declared = entry.loaded.steps[0].declared  # type: ignore[union-attr]
            if len(declared) != len(entry.outputs):
                return  # (not an op the door knows how to make: Python's, every time)
            outputs = [
                (list(d[0]) if d else [], list(d[1]) if d else [], r.kind is NONE)
                for d, r in zip(declared, entry.outputs, strict=True)
            ]
            door.offer(spec.name, (rt, entry), outputs, False, *_launch_of(rt, entry))
        else:  # (it writes its first argument)
            door.offer(spec.name, (rt, entry), [], True, *_launch_of(rt, entry))


def _launch_of(rt: runtime.Runtime, entry: Entry) -> tuple[object, object, int, object]:
    """What the C++ door launches a served call with: the runtime's timeline (its C++ core),
    the executable's cost and the host's modelled dispatch time; and the release its
    outputs' storages call when they die."""
    return rt.timeline.core, entry.loaded.cost, rt.dispatch_ns, rt.memory._release  # type: ignore[union-attr]


def _servable(
    spec: OpSpec,
    entry: Entry,
    args: Args,
    kwargs: Kwargs,
    tensors: list[torch.Tensor],
    scalars: list[float],
) -> bool:
    """The C++ door computes what the entry's executable computes: the op itself, with the
    CPU's own kernel, called with the arguments the call was given (its executable's one
    step rebuilds exactly these from the call's tensors and floats; the signature keys the
    rest), and no generator."""
    loaded = entry.loaded
    if (
        loaded is None
        or not loaded.single
        or not entry.verified
        or entry.takes is not None
        or entry.cpu_draw
        or entry.out_args
        or (spec.shape_from_scalars and scalars)  # (the C++ key has ints' values, not floats')
        or spec.mutated  # (batch_norm's running statistics: a write the door would not see)
        or not (
            entry.one_fresh_output or several_fresh(entry) or writes_first(entry, args, tensors)
        )
    ):
        return False
    step = loaded.steps[0]
    if (
        step.name != spec.name
        or step.generator_arg
        or step.call_op is not step.op._op  # (one of our own kernels: simulator/kernels.py)
        or step.wrapped
    ):
        return False
    try:
        positional = [b(tensors, {}, scalars) for b in step.positional]
        keywords = {name: b(tensors, {}, scalars) for name, b in step.keywords}
    except (KeyError, IndexError):  # (a builder reading what an eager call has not)
        return False
    return (
        _same(positional, list(args))
        and keywords.keys() == kwargs.keys()
        and all(_same(keywords[k], kwargs[k]) for k in kwargs)
    )


def several_fresh(entry: Entry) -> bool:
    """The entry's op returns several new tensors of known sizes, or Nones where it makes
    none (layer_norm's backward with an output_mask), and nothing else (layer_norm, topk,
    nll_loss_forward...)."""
    returns = entry.returns
    return (
        len(returns) > 1
        and not entry.dynamic
        and all(r.kind is FRESH or r.kind is NONE for r in returns)
        and any(r.kind is FRESH for r in returns)
    )


def writes_first(entry: Entry, args: Args, tensors: list[torch.Tensor]) -> bool:
    """The entry's op writes its first argument, a device tensor, and returns it (add_,
    mul_, zero_, copy_...), and makes nothing else."""
    returns = entry.returns
    return (
        len(returns) == 1
        and returns[0].kind is WRITE
        and returns[0].arg == 0
        and not entry.dynamic
        and bool(args)
        and bool(tensors)
        and args[0] is tensors[0]
        and not tensors[0].is_cpu
    )


def _same(built: object, given: object) -> bool:
    """Whether the executable's argument is the call's: the same tensor, an equal value of
    the same type, or the CPU for the device (factories build on the CPU, and so does the
    C++ door)."""
    if isinstance(built, torch.Tensor) or isinstance(given, torch.Tensor):
        return built is given
    if isinstance(given, torch.device) and given.type == "neuron":
        return built == CPU and given.index in (None, 0)
    if isinstance(built, (list, tuple)) and isinstance(given, (list, tuple)):
        return len(built) == len(given) and all(
            _same(x, y) for x, y in zip(built, given, strict=True)
        )
    return type(built) is type(given) and built == given


def offer_view(spec: OpSpec) -> None:
    """The Python door made a view (client/door/kernel.py _view): the C++ door may make this
    op's views from now on, when no recording wants them."""
    door = _module
    if door is not None:
        door.offer_view(spec.name)


def set_on(on: bool) -> None:
    """The runtime's mode changed: the C++ door looks signatures up only in eager mode with
    numerics on (a recording mode takes every op, and shape-only runs compute nothing)."""
    door = _module
    if door is not None:
        on = on and not _suspended[0]
        door.set_on(on)
        _on[0] = on


@contextlib.contextmanager
def python_door_only() -> Iterator[None]:
    """Inside the block every op takes the Python door, as with NEURON_FAST_DOOR=off (for
    benchmarks and tests that compare the two doors in one process)."""
    was = _suspended[0]
    _suspended[0] = True
    set_on(False)
    try:
        yield
    finally:
        _suspended[0] = was
        rt = runtime._runtime
        if rt is not None:
            set_on(_eager(rt))


def stats() -> dict[str, int]:
    """Calls served in C++, calls handed on to Python, signatures and view ops it serves."""
    door = _module
    return dict(door.stats()) if door is not None else {}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="make door",
        description="Builds trnsim's C++ door if it is not built yet (about 40 s, g++ and "
        "ninja), loads it and says where it is; `make setup` runs it.",
    )
    parser.parse_args()
    door = load()
    if door is None:
        reason = f"{ENV}=off" if not enabled() else "it could not be built (the warning above)"
        print(f"trnsim's C++ door is off: {reason}; every op takes the Python door")
        return
    print(f"trnsim's C++ door: {door.__file__}")
