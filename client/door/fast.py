"""The C++ door (fast_door.cpp): PyTorch's PrivateUse1 kernel of the ops the Python door
serves, which serves warm eager calls itself and hands every other call on to Python.

A warm eager call of an op that returns new tensors (add, mm, silu, layer_norm, topk,
cat...), of an in-place op writing its first argument (add_, mul_, zero_, copy_...), of a
view op, of `empty` or of a copy between neuron tensors costs the Python door a dozen
Python steps of about a microsecond each (docs/host-time.md). The C++ door keys the call by
its signature without converting it to Python objects and, for a signature Python has
offered (`offer`, from eager mode's hot path), runs the CPU's kernel over host aliases
itself. Python keeps the accounting, in one short call (`_served`, `_served_many`, `_made`;
an in-place op's `_may_write` before its kernel runs and `_wrote` after), so simulated
time, memory and counters are the Python door's. Anything else (recording modes,
shape-only runs, collectives awaited, shapes being recorded, an op that fails) goes
through the Python door as before.

The door is built from its source on first use (torch.utils.cpp_extension: g++ and ninja,
about a minute, once per machine and source) into ~/.cache/trnsim/door/<source hash>, and
loaded from there after. NEURON_FAST_DOOR=off keeps every op on the Python door; without a
compiler the Python door serves everything, with one warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
import sysconfig
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import torch
from trnsim.client.core import env, runtime, shapes
from trnsim.client.core.errors import execution_error
from trnsim.client.core.ops import FRESH, NONE, WRITE, Entry, OpSpec
from trnsim.client.core.types import Args, Kwargs
from trnsim.simulator.shape_only import NUMERICS

SOURCE = Path(__file__).with_name("fast_door.cpp")
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


def build_directory() -> Path:
    """Where the door is built: per source, torch and Python, so a change rebuilds it."""
    built_for = f"{torch.__version__} {sys.version} {sysconfig.get_config_var('EXT_SUFFIX')}"
    digest = hashlib.sha256(SOURCE.read_bytes() + built_for.encode()).hexdigest()[:12]
    return env.cache_home() / "trnsim" / "door" / digest


def load(build: bool = True) -> ModuleType | None:
    """The C++ door's module: loaded if built, else built now (when `build`); None when
    NEURON_FAST_DOOR is off or it cannot be built (a warning says why, once)."""
    global _module, _tried
    if _module is not None or _tried:
        return _module
    _tried = True
    try:
        if not enabled():
            return None
    except env.ConfigError as e:
        warnings.warn(f"{e}; the C++ door stays off", RuntimeWarning, stacklevel=2)
        return None
    where = build_directory()
    built = where / f"{NAME}.so"
    try:
        if not built.exists():
            if not build:
                _tried = False
                return None
            _build(where)
        spec = importlib.util.spec_from_file_location(NAME, built)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, RuntimeError, ImportError) as e:  # (no compiler, no ninja, a failed build)
        warnings.warn(
            f"trnsim's C++ door could not be built or loaded ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[-1] if str(e).strip() else e!r}); every op takes "
            f"the Python door, which costs several microseconds more per op. Install g++ "
            f"and ninja (pip install ninja): the next run builds it; or set {ENV}=off to "
            f"silence this.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    _module = module
    return module


def _build(where: Path) -> None:
    from torch.utils.cpp_extension import load as build_extension

    print(
        f"trnsim: building its C++ door (once per machine and version, about a minute; "
        f"{ENV}=off skips it) in {where}",
        file=sys.stderr,
        flush=True,
    )
    where.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_extension(
            NAME,
            [str(SOURCE)],
            extra_cflags=["-O2"],
            build_directory=str(where),
            is_python_module=True,
            verbose=False,
        )


def module() -> ModuleType | None:
    """The door's module once loaded (None: every op takes the Python door)."""
    return _module


# -- what the C++ door calls back -----------------------------------------------------------------
def _served(token: tuple[runtime.Runtime, Entry], host: torch.Tensor, out: torch.Tensor) -> bool:
    """A warm call of the token's signature, computed in C++ (`host`, the CPU's result, and
    `out`, the neuron tensor over its memory): False if the Python door must take the call
    now, else accounted as eager.run accounts it (its counters, HBM block, launch and the
    block's adoption by the output's storage)."""
    rt, entry = token
    if not _counted(rt):
        return False
    memory = rt.memory
    block = memory.allocate(entry.one_fresh_output)  # type: ignore[arg-type]
    rt.launch(entry.loaded)  # type: ignore[arg-type]
    memory.adopt(out, block, host)
    return True


def _served_many(
    token: tuple[runtime.Runtime, Entry],
    hosts: tuple[torch.Tensor, ...],
    outs: tuple[torch.Tensor, ...],
) -> bool:
    """_served() of an op returning several new tensors (layer_norm's output, mean and
    rstd), and perhaps Nones (an output_mask's False): a block for each tensor, allocated in
    order as eager mode allocates them, one launch."""
    rt, entry = token
    if not _counted(rt):
        return False
    memory = rt.memory
    made = [k for k, r in enumerate(entry.returns) if r.kind is FRESH]  # (not the NONEs)
    blocks = [memory.allocate(entry.returns[k].nbytes) for k in made]
    rt.launch(entry.loaded)  # type: ignore[arg-type]
    for k, block in zip(made, blocks, strict=True):
        memory.adopt(outs[k], block, hosts[k])
    return True


def _made(host: torch.Tensor, out: torch.Tensor, nbytes: int) -> bool:
    """An empty tensor made in C++ (`host`, its CPU memory, and `out`, the neuron tensor over
    it): False if the Python door must make it now, else accounted as the Python door's
    `empty` accounts it (counted, and an HBM block of `nbytes` its storage adopts)."""
    rt = runtime._runtime
    if rt is None or not _direct_kernels[0] or not _eager(rt):
        return False
    rt.counts["ops_dispatched"] += 1
    memory = rt.memory
    memory.adopt(out, memory.allocate(nbytes), host)
    return True


_direct_kernels = [False]  # whether client/api/backend.py has registered its direct kernels


def direct_kernels_registered() -> None:
    """The Python door's direct kernels are registered (on its first op, which must be
    Python's: an `empty` the C++ door made before would leave mm to its composite)."""
    _direct_kernels[0] = True


def _may_write(token: tuple[runtime.Runtime, Entry]) -> bool:
    """A warm call of an in-place op, about to be computed in C++ into its first argument's
    memory: False if the Python door must take the call (nothing is written yet), else
    counted as eager mode counts it."""
    return _counted(token[0])


def _wrote(token: tuple[runtime.Runtime, Entry]) -> None:
    """The in-place op _may_write let through has written its first argument: its launch."""
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
            door.offer(spec.name, (rt, entry), outputs, False)
        else:  # (it writes its first argument)
            door.offer(spec.name, (rt, entry), [], True)


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
        description="Builds trnsim's C++ door if it is not built yet (about 20 s, g++ and "
        "ninja), loads it and says where it is; `make setup` runs it.",
    )
    parser.parse_args()
    door = load()
    if door is None:
        reason = f"{ENV}=off" if not enabled() else "it could not be built (the warning above)"
        print(f"trnsim's C++ door is off: {reason}; every op takes the Python door")
        return
    print(f"trnsim's C++ door: {door.__file__}")
