"""Compiled mode: `torch.compile(model, backend="neuron")`.

Dynamo captures the Python; AOTAutograd (torch._functorch) lowers each captured graph to a
functionalized ATen forward graph and, when gradients are needed, a backward graph. Each of
those runs as one compiled region (client/modes/region.py): its ops are recorded whole by the
region recorder (beside adaptive mode's, over the same buffer: client/modes/tape.py), the region
is compiled at the fused level (-O2) through the same compile client — so the daemon
dedupes and caches it across processes — and launched once per call.

What the compiler cannot take splits the region: an op with a data-dependent output shape
or one the compiler does not fuse runs on its own, eagerly, and the rest goes on; dynamo's
own graph breaks leave the Python between graphs to run in the process's eager mode. A
region compiles on its first call (its ops get no executables of their own) and the fused
run checks each output against the metadata the graph was traced with.

Dynamic sizes (dynamic=True, mark_dynamic, or dynamo's own after a size changes) run in
buckets (policy/buckets.py): the first size in a bucket compiles the graph traced at
the bucket's sizes, and that executable runs every size in it, computed at the real size
and timed as the bucket (simulator/execute.py LoadedExecutable.at_size). A graph that
does not stay one region at the bucket's sizes compiles per size instead.

Dynamo recompiles a function when its guards fail (a new shape, a new dtype...); the
reasons are kept per function and shown by `explain()` (`torch.neuron.compiled_explain()`).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypedDict, final

import torch
from trnsim.client.core import env, errors, runtime
from trnsim.client.core.notes import NOTES, Frame
from trnsim.client.core.types import Op, OpValue
from trnsim.client.modes.prepared import MISSED, Prepared, Traced, prepare
from trnsim.client.modes.region import Bound, compiled_region
from trnsim.policy import buckets
from trnsim.simulator import execute

if TYPE_CHECKING:
    import sympy  # type: ignore[import-untyped]

NAME = "neuron"
log = logging.getLogger(__name__)
_BUCKETS = buckets.parse(env.shape_buckets())

# AOTAutograd's decompositions: none. The chip's compiler takes ATen's ops as they are
# (its op table classifies each onto an engine), and the executor runs each with the CPU's
# own kernel, so a compiled region computes what its ops compute in eager mode, op for op
# (where AOTAutograd's graph holds other ops than eager dispatch meets, results differ as
# PyTorch's own aot_eager backend's do on the CPU).
DECOMPOSITIONS: dict[Op, Callable[..., OpValue]] = {}
# Traced calls of a region that could not be prepared as one callable before it stops trying,
# and how many layouts of its inputs it keeps prepared.
PREPARE_TRIES = 2
PREPARED = 4
# What AOTAutograd runs for one of its graphs (boxed: it takes the list of the graph's
# inputs, tensors and sizes, and empties it).
Run = Callable[[list[OpValue]], OpValue]


def _numpy_random_as_in_eager() -> None:
    """numpy.random calls in compiled code draw from numpy's own stream (dynamo's default
    traces them into torch's generator): a compiled step then draws what the eager one does
    (transformers' wav2vec2 masks time steps with numpy.random)."""
    import torch._dynamo.config

    torch._dynamo.config.use_numpy_random_stream = True


_numpy_random_as_in_eager()


def _region(kind: str, gm: torch.fx.GraphModule, sizes: _SymbolicSizes | None, draws: bool) -> Run:
    """The callable AOTAutograd runs for one of its graphs: the graph's ops as one region.
    With symbolic sizes, each call runs in its sizes' bucket: the bucket's executable is
    compiled once, from the graph traced at the bucket's sizes, and runs every size in it."""
    _source_lines(gm)
    run_graph = gm.forward
    where = _graph_where(gm)
    executables: dict[tuple[int, ...], execute.LoadedExecutable | None] = {}  # bounds -> it
    # The region prepared as one callable for each of the last PREPARED inputs' layouts
    # (client/modes/prepared.py), and how many traced calls could not be (after
    # PREPARE_TRIES, every call is traced).
    prepared: list[Prepared] = []
    refused = 0
    # What the graph computes on the CPU runs in its Python, not through the device: a
    # replay runs it first, as a graph of its own (None: nothing), or never replays.
    cpu = _cpu_part(gm)
    if isinstance(cpu, str):
        refused = PREPARE_TRIES
        NOTES.unprepared.append(f"{kind} graph from {where}: traced every call ({cpu})")

    def run(args: list[OpValue]) -> OpValue:
        nonlocal prepared, refused
        flat = list(args)
        args.clear()  # (boxed convention: the graph owns its inputs from here)
        rt = runtime.get()
        rt.count("compiled_calls")
        bound = None
        if sizes is not None and not _BUCKETS.exact:
            bounds = tuple(_BUCKETS.bound(v) for v in sizes.values(flat))
            if bounds not in executables:
                executables[bounds] = _compile_bucket(
                    rt, kind, run_graph, sizes, flat, bounds, draws
                )
            if executables[bounds] is not None:
                bound = Bound(executables[bounds])
        for plan in prepared:  # (each is one layout of the inputs: in a bucket, one size)
            result = plan.replay(rt, flat)
            if result is not MISSED:
                return result
        traced = Traced() if refused < PREPARE_TRIES else None
        seen: _CpuSeen | None = None
        with compiled_region(rt, bound, draws, traced):
            if traced is not None and isinstance(cpu, _CpuPart):
                seen = _CpuSeen(gm, cpu)  # (the graph run node by node: its CPU values seen)
                result = seen.run(*flat)
            else:
                result = run_graph(*flat)
        if traced is not None:
            fed = seen.fed if seen is not None else {}
            made = prepare(rt, traced, flat, result, _constants(gm), fed)
            if seen is not None:
                seen.values.clear()
            if isinstance(made, str):
                refused += 1
                if refused == PREPARE_TRIES:
                    NOTES.unprepared.append(
                        f"{kind} graph from {where}: traced every call ({made})"
                    )
            else:
                made.bucket_run = bound is not None and not bound.cut
                if isinstance(cpu, _CpuPart):
                    made.cpu_part = cpu.module
                prepared = [made, *prepared[: PREPARED - 1]]
        return result

    run._boxed_call = True  # type: ignore[attr-defined]
    run.__name__ = f"neuron_{kind}"
    return run


def _compile_bucket(
    rt: runtime.Runtime,
    kind: str,
    run_graph: Callable[..., OpValue],
    sizes: _SymbolicSizes,
    real: list[OpValue],
    bounds: tuple[int, ...],
    draws: bool,
) -> execute.LoadedExecutable | None:
    """The bucket's executable: the graph traced at the bucket's sizes (over stand-ins for
    the inputs it could write) and compiled, nothing run. None: it cannot be one executable
    (the trace is cut, or fails at those sizes); its sizes then compile one by one."""
    at = dict(zip(sizes.symbols, bounds, strict=True))
    where = ", ".join(
        f"{name}={v}->{b}"
        for name, v, b in zip(sizes.names, sizes.values(real), bounds, strict=True)
    )
    bound = Bound(compile_only=True)
    try:
        stand_ins = sizes.stand_ins(real, at)
        with compiled_region(rt, bound, draws):
            held = run_graph(*stand_ins)  # (its outputs are the graph's: alive at the flush)
        del held
    except Exception as e:  # noqa: BLE001  (the real sizes still run, compiled one by one)
        bound.cut = bound.cut or f"{type(e).__name__}: {e}"
    if bound.cut or bound.executable is None:
        rt.count("compiled_buckets_refused")
        NOTES.buckets.append(f"{kind} graph: {where}: no bucket ({bound.cut or 'no ops'})")
        return None
    NOTES.buckets.append(f"{kind} graph: {where}: bucket compiled")
    return bound.executable


@final
class _CpuPart:
    """The ops of a graph that compute or write on the CPU (an optimizer's step counts and
    bias corrections), as a graph of their own over the same inputs: `module(*inputs)`
    returns the CPU values the rest of the graph reads (`fed`, in order) and writes the CPU
    inputs the graph writes. A prepared replay runs it before the region's executable."""

    def __init__(self, module: torch.fx.GraphModule, fed: list[torch.fx.Node]) -> None:
        self.module = module
        self.fed = fed


def _on_cpu(value: object) -> bool:
    values = value if isinstance(value, (tuple, list)) else (value,)
    return any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in values)


def _cpu_op(node: torch.fx.Node) -> str | None:
    """Why the node is CPU work (it makes a CPU tensor, reads a number from one, or writes
    one), or None."""
    target = node.target
    value = node.meta.get("val")
    reads_cpu = any(_on_cpu(a.meta.get("val")) for a in node.all_input_nodes)
    if _on_cpu(value) or (reads_cpu and not isinstance(value, (torch.Tensor, tuple, list))):
        # (a tensor made on the CPU, or a number read from one: .item() in the graph)
        return f"computes {getattr(target, '__name__', target)} on the CPU"
    if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
        for arg, given in zip(target._schema.arguments, node.args, strict=False):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            for item in given if isinstance(given, (tuple, list)) else (given,):
                if isinstance(item, torch.fx.Node) and _on_cpu(item.meta.get("val")):
                    return f"writes a CPU tensor ({target.__name__})"
    return None


def _cpu_part(gm: torch.fx.GraphModule) -> _CpuPart | str | None:
    """The graph's CPU work as a graph of its own (None: it has none), or why it cannot run
    apart from the rest (it reads a device value, or draws random numbers on the CPU)."""
    cpu: dict[torch.fx.Node, None] = {}  # (in graph order)
    for node in gm.graph.nodes:
        if node.op == "call_function" and _cpu_op(node) is not None:
            cpu[node] = None
    if not cpu:
        return None
    for node in cpu:
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and (
            torch.Tag.nondeterministic_seeded in target.tags
        ):
            return f"draws random numbers on the CPU ({target.__name__})"
        for a in node.all_input_nodes:
            if a.op not in ("placeholder", "get_attr") and a not in cpu:
                why = _cpu_op(node)
                return f"{why}, from a device value"
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = graph.placeholder(node.name)
        elif node.op == "get_attr" or node in cpu:
            env[node] = graph.node_copy(node, lambda n: env[n])
    fed = [n for n in cpu if any(u not in cpu for u in n.users)]
    for node in fed:
        if _is_alias(node) and any(u not in cpu and u.op != "output" for u in node.users):
            # (the device reads it where it stands in the graph; the part runs whole first,
            # so a view would show what the part writes after it)
            return f"the device reads a view made on the CPU ({node.name})"
    graph.output(tuple(env[n] for n in fed))
    return _CpuPart(torch.fx.GraphModule(gm, graph), fed)


def _is_alias(node: torch.fx.Node) -> bool:
    """Whether the node's value may be a view of another (a view op, or an item of one)."""
    target = node.target
    if target is operator.getitem:
        source = node.args[0]
        return isinstance(source, torch.fx.Node) and _is_alias(source)
    if isinstance(target, torch._ops.OpOverload):
        return any(r.alias_info is not None for r in target._schema.returns)
    return True  # (not an ATen op: assume it may be)


class _CpuSeen(torch.fx.Interpreter):
    """A traced call of a graph with CPU work, run node by node: the CPU values the rest of
    the graph reads, by id (`fed`: id -> (index in the CPU part's outputs, element in a list
    or -1)), held until the call is prepared (so no other tensor takes their id)."""

    def __init__(self, gm: torch.fx.GraphModule, cpu: _CpuPart) -> None:
        super().__init__(gm)
        self.index = {node: k for k, node in enumerate(cpu.fed)}
        self.fed: dict[int, tuple[int, int]] = {}
        self.values: list[object] = []

    def run_node(self, n: torch.fx.Node) -> object:
        result = super().run_node(n)
        k = self.index.get(n)
        if k is not None:
            self.values.append(result)
            if isinstance(result, (tuple, list)):
                for j, item in enumerate(result):
                    self.fed[id(item)] = (k, j)
            else:
                self.fed[id(result)] = (k, -1)
        return result


def _draws_in_order(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph's draws from the CPU's generator all come from device ops, which
    the region records and runs in order at its end: no random op of it runs on the CPU
    (that one would draw when called, ahead of the recorded ones)."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if torch.Tag.nondeterministic_seeded not in target.tags:
            continue
        value = node.meta.get("val")
        values = value if isinstance(value, (tuple, list)) else (value,)
        if not any(isinstance(v, torch.Tensor) and v.device.type == NAME for v in values):
            return False
    return True


def _constants(gm: torch.fx.GraphModule) -> dict[int, torch.Tensor]:
    """The graph's own tensors (its get_attr nodes), by id."""
    out = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value: object = gm
            for name in str(node.target).split("."):
                value = getattr(value, name)
            if isinstance(value, torch.Tensor):
                out[id(value)] = value
    return out


def _graph_where(gm: torch.fx.GraphModule) -> str:
    """The user's line of the graph's first op that has one (how explain() names it)."""
    import re

    for node in gm.graph.nodes:
        frames = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
        if frames:
            return f"{frames[-1][0]}:{frames[-1][1]}"
    return "an unknown line"


def _source_lines(gm: torch.fx.GraphModule) -> None:
    """Names the user's line for each line of the graph's generated code (its node's
    stack trace), so errors and profiles of a compiled region point at the user's program."""
    import linecache
    import re

    realize = getattr(gm, "real_recompile", None)  # (a lazy graph module generates it now)
    if realize is not None:
        realize()
    filename = gm.forward.__code__.co_filename
    nodes = {n.name: n for n in gm.graph.nodes}
    lines: dict[int, tuple[str, int, str]] = {}
    for k, text in enumerate(linecache.getlines(filename), start=1):
        assigned = re.match(r"\s+(\w+) = ", text)
        node = nodes.get(assigned.group(1)) if assigned else None
        trace = node.meta.get("stack_trace") if node is not None else None
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace or "")
        if frames:
            lines[k] = (frames[-1][0], int(frames[-1][1]), frames[-1][2])
    errors.GENERATED[filename] = lines


class _SymbolicSizes:
    """A graph's inputs whose sizes are symbolic (dynamic=True, mark_dynamic): where each
    symbol's value is read from a real call, and each input's sizes at other values."""

    def __init__(self, example_inputs: Sequence[object], mutated: set[int]) -> None:
        import sympy  # type: ignore[import-untyped]

        # per input: None (static), an int expr, or (sizes, strides, dtype, device)
        self.exprs: list[sympy.Expr | _Geometry | None] = []
        found: dict[sympy.Symbol, tuple[int, int | None]] = {}  # symbol -> (input, dim or None)
        free: set[sympy.Symbol] = set()
        for i, e in enumerate(example_inputs):
            if isinstance(e, torch.SymInt):
                expr = e.node.expr
                self.exprs.append(expr)
                free |= expr.free_symbols
                if isinstance(expr, sympy.Symbol):
                    found.setdefault(expr, (i, None))
            elif isinstance(e, torch.Tensor) and (
                any(isinstance(d, torch.SymInt) for d in (*e.shape, *e.stride())) or i in mutated
            ):
                shape = [_expr(d) for d in e.shape]
                stride = [_expr(d) for d in e.stride()]
                self.exprs.append((shape, stride, e.dtype, e.device))
                for d, expr in enumerate(shape):
                    if isinstance(expr, sympy.Symbol):
                        found.setdefault(expr, (i, d))
                for expr in (*shape, *stride):
                    free |= getattr(expr, "free_symbols", set())
            else:
                self.exprs.append(None)
        self.symbols = sorted(free, key=str)
        self.names = [str(sym) for sym in self.symbols]
        self.readable = free <= set(found)  # every symbol appears bare somewhere
        self.where = [found.get(sym) for sym in self.symbols]

    def values(self, args: list[OpValue]) -> tuple[int, ...]:
        out = []
        for i, d in self.where:  # type: ignore[misc]
            out.append(int(args[i]) if d is None else int(args[i].shape[d]))
        return tuple(out)

    def stand_ins(self, args: list[OpValue], at: dict[sympy.Symbol, int]) -> list[OpValue]:
        """The inputs at the bucket's sizes: new empty tensors for the symbolic and the
        written ones, the others as they are (a trace reads nothing)."""
        out: list[OpValue] = []
        for arg, expr in zip(args, self.exprs, strict=True):
            if expr is None:
                out.append(arg)
            elif isinstance(expr, tuple):
                shape, stride, dtype, device = expr
                out.append(
                    torch.empty_strided(
                        [_value(x, at) for x in shape],
                        [_value(x, at) for x in stride],
                        dtype=dtype,
                        device=arg.device if isinstance(arg, torch.Tensor) else device,
                    )
                )
            else:
                out.append(_value(expr, at))
        return out


# An input's sizes and strides (each an int or an expression in the symbols), dtype, device.
_Geometry = tuple[list["sympy.Expr | int"], list["sympy.Expr | int"], torch.dtype, torch.device]


def _expr(d: torch.SymInt | int) -> sympy.Expr | int:
    return d.node.expr if isinstance(d, torch.SymInt) else int(d)


def _value(expr: sympy.Expr | int, at: dict[sympy.Symbol, int]) -> int:
    if isinstance(expr, int):
        return expr
    import sympy  # type: ignore[import-untyped]

    value = sympy.sympify(expr).xreplace({k: sympy.Integer(v) for k, v in at.items()})
    if not value.is_Integer:
        raise ValueError(f"{expr} is not a whole number at {at}")
    return int(value)


def _symbolic_sizes(
    gm: torch.fx.GraphModule, example_inputs: Sequence[object], draws: bool
) -> _SymbolicSizes | None:
    """The graph's symbolic sizes, or None: none (static shapes), bucketing turned off
    (NEURON_SHAPE_BUCKETS=exact), a symbol no input carries bare, or a graph a trace at
    the bucket's sizes could not leave without effects (a CPU random op would draw, a
    collective would reach the other ranks): those compile per size."""
    if _BUCKETS.exact or not any(
        isinstance(e, torch.SymInt)
        or (isinstance(e, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in e.shape))
        for e in example_inputs
    ):
        return None
    if not draws or any(
        str(getattr(n.target, "namespace", "")).startswith("_c10d") for n in gm.graph.nodes
    ):
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {n: i for i, n in enumerate(placeholders)}
    mutated = set()
    for node in gm.graph.nodes:  # (functionalized: inputs are written by copy_ at the end)
        target = getattr(node.target, "_schema", None)
        if node.op == "call_function" and target is not None and target.is_mutable:
            for a in node.args:
                if a in index:
                    mutated.add(index[a])
    sizes = _SymbolicSizes(example_inputs, mutated)
    return sizes if sizes.readable and sizes.symbols else None


def _compiler(kind: str) -> Callable[[torch.fx.GraphModule, Sequence[object]], Run]:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> Run:
        rt = runtime.get()
        rt.count(f"compiled_{kind}_graphs")
        draws = _draws_in_order(gm)
        return _region(kind, gm, _symbolic_sizes(gm, example_inputs, draws), draws)

    return compile_graph


def backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[object], **kwargs: object
) -> Callable[..., OpValue]:
    """The dynamo backend "neuron" (entry point torch_dynamo_backends)."""
    from torch._dynamo.backends.common import aot_autograd

    rt = runtime.get()
    rt.count("compiled_dynamo_graphs")
    _note_frame()
    masked = _boolean_mask_indexing(gm)
    if masked:
        # AOTAutograd traces such a graph's backward (IndexPutBackward: a nonzero of the
        # mask) on fake tensors in the autograd engine's device thread, where a Python
        # backend's data-dependent shape is lost as an error and can abort the process.
        _eager(rt, f"boolean-mask indexing at {masked}")
        return gm.forward
    lower = aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=DECOMPOSITIONS,
        keep_inference_input_mutations=True,
    )
    try:
        # (node metadata kept through AOTAutograd's trace: each ATen node carries the user's
        # source line, which the recorder and the profiler show)
        with torch.fx.traceback.preserve_node_meta():
            return lower(gm, example_inputs, **kwargs)
    except torch._dynamo.exc.TorchDynamoException:
        raise  # dynamo's own control flow (restarting its analysis, skipping a frame...)
    except Exception as e:  # noqa: BLE001  (never the user's step: this graph runs eagerly)
        first = str(e).splitlines()[0][:200] if str(e) else ""
        _eager(rt, f"{type(e).__name__}: {first}")
        return gm.forward


def _note_frame() -> None:
    """Remembers, for the code dynamo is compiling, the nn.Module it runs for (its `self`,
    or the first argument of a wrapper around a forward) and the user's line that called it
    (the last compile's: a recompile's)."""
    import inspect

    from torch._dynamo.symbolic_convert import InstructionTranslator

    tx = getattr(InstructionTranslator, "current_tx", lambda: None)()
    if tx is None:
        return
    frames = NOTES.frames  # (dynamo names the code: a decorator's wrapper, or its own)
    if tx.f_code in frames:
        frames[tx.f_code]["called_at"] = errors.script_location()
        return
    scope = tx.f_locals
    owner = scope.get("self")
    if not isinstance(owner, torch.nn.Module):
        args = scope.get("args")
        owner = args[0] if isinstance(args, tuple) and args else None
    note: Frame = {"called_at": errors.script_location()}
    if isinstance(owner, torch.nn.Module):
        cls = type(owner)
        forward = inspect.unwrap(cls.forward)
        code = getattr(forward, "__code__", None)
        where = f" at {code.co_filename}:{code.co_firstlineno}" if code is not None else ""
        note["module"] = f"{cls.__qualname__}.forward{where}"
    frames[tx.f_code] = note


def _eager(rt: runtime.Runtime, why: str) -> None:
    """A graph that runs in the process's eager mode instead of compiled (counted, said
    once): dynamo's captured graph itself, called op by op."""
    rt.count("compiled_fallbacks")
    NOTES.eager_fallbacks.append(why)
    if not NOTES.warned_fallback:
        NOTES.warned_fallback = True
        log.warning(
            "torch.compile(backend='neuron'): a graph runs in the eager mode instead (%s); "
            "counter compiled_fallbacks, reasons in torch.neuron.compiled_explain()",
            why,
        )


def _boolean_mask_indexing(gm: torch.fx.GraphModule) -> str:
    """Where the graph indexes a tensor with a boolean mask (x[mask], x[mask] = v) and
    needs its gradient: the source line, or "" if it does not."""
    import operator

    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (operator.getitem, operator.setitem):
            continue
        args = node.args
        if len(args) < 2:
            continue
        base, index = args[0], args[1]
        base_value = getattr(base, "meta", {}).get("example_value")
        indices = index if isinstance(index, (tuple, list)) else (index,)
        for i in indices:
            value = getattr(i, "meta", {}).get("example_value")
            if (
                isinstance(value, torch.Tensor)
                and value.dtype == torch.bool
                and isinstance(base_value, torch.Tensor)
                and base_value.requires_grad
            ):
                return str(node.meta.get("stack_trace", "")).strip().splitlines()[-2:][0].strip()
    return ""


# explain()'s rows: a graph run in the eager mode instead, a shape bucket compiled or refused,
# a function dynamo recompiled (with what compiled mode noted of it: notes.Frame).
@final
class EagerFallback(TypedDict):
    eager_fallback: str


@final
class ShapeBucket(TypedDict):
    shape_bucket: str


@final
class Unprepared(TypedDict):
    unprepared: str


@final
class Recompiled(Frame):
    function: str
    where: str
    recompiles: int
    reasons: list[str]


Explained = EagerFallback | ShapeBucket | Unprepared | Recompiled


def explain() -> list[Explained]:
    """Why compiled functions recompiled: for each one dynamo recompiled, its name, file and
    line, and the guard failures that caused each recompile (dynamo's own reasons); then
    each graph that runs in the eager mode instead of compiled, each shape bucket, and each
    region traced on every call instead of replayed as one callable, and why."""
    from torch._dynamo.utils import guard_failures

    out: list[Explained] = [{"eager_fallback": why} for why in NOTES.eager_fallbacks]
    out += [{"shape_bucket": what} for what in NOTES.buckets]
    out += [{"unprepared": what} for what in NOTES.unprepared]
    for code, reasons in guard_failures.items():
        out.append(
            {
                "function": code.co_name,
                "where": f"{code.co_filename}:{code.co_firstlineno}",
                **NOTES.frames.get(code, {}),
                "recompiles": len(reasons),
                "reasons": [str(r) for r in reasons],
            }
        )
    return out
