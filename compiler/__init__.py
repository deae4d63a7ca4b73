"""The compiler: a small graph of ATen ops -> an executable for one simulated NeuronCore.

`compile` runs PASSES in order over one Compilation; each pass returns a line saying what
it did (printed by `python -m trnsim.compiler --explain`). Fusion will join the list
between the graph rewrites and classification.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from trnsim.compiler import graph as ir
from trnsim.compiler.compile_time import modelled_compile_seconds
from trnsim.compiler.emit import emit
from trnsim.compiler.fusion import fuse, singletons
from trnsim.compiler.keys import (
    CacheKey,
    KeyPart,
    cache_key,
    cache_key_from_proto,
    differences,
    key_parts,
    nearest,
)
from trnsim.compiler.lower import Instr, Kernel, classify, lower
from trnsim.compiler.memory_plan import MemoryPlan, MemoryPlanError, memory_plan
from trnsim.compiler.passes import eliminate_common_subexpressions, eliminate_dead_code
from trnsim.compiler.schedule import list_schedule
from trnsim.compiler.search import LAYOUTS, Candidate, Search
from trnsim.compiler.version import FORMAT_VERSION, compiler_version
from trnsim.protos import executable_pb2, graph_pb2
from trnsim.simulator.config import Target, get_target

__all__ = [
    "FORMAT_VERSION",
    "PASSES",
    "CacheKey",
    "Compilation",
    "CompileError",
    "GraphTooLargeError",
    "KeyPart",
    "MemoryPlanError",
    "cache_key",
    "cache_key_from_proto",
    "compile",
    "compiler_version",
    "differences",
    "key_parts",
    "nearest",
]


class CompileError(ValueError):
    """Unrecoverable for this graph: deterministic, so the same graph fails the same way."""


class GraphTooLargeError(CompileError):
    """Unrecoverable for this graph on this target: it needs more device memory (HBM, SBUF)
    than the target has. Smaller tensors, or the work split into smaller graphs, fit."""


@dataclass
class Compilation:
    graph: ir.Graph
    target: Target
    options: executable_pb2.CompileOptions
    debug: graph_pb2.GraphDebug | None = None
    key: CacheKey | None = None
    kernels: list[Kernel] = field(default_factory=list)
    groups: list[list[int]] = field(default_factory=list)
    plan: MemoryPlan | None = None
    instructions: list[Instr] = field(default_factory=list)
    makespan_ns: float = 0.0
    o1_makespan_ns: float = 0.0  # the -O1 schedule's (the search's baseline)
    o1_work: tuple[int, int] = (0, 0)  # -O1's instructions and kernels
    schedules_searched: int = 0
    compile_seconds: float = 0.0  # modelled (compiler/compile_time.py)
    executable: executable_pb2.Executable | None = None
    log: list[str] = field(default_factory=list)

    @property
    def hbm_budget(self) -> int:
        return self.options.hbm_budget_bytes or self.target.hbm_bytes

    @property
    def sbuf_budget(self) -> int:
        return self.options.sbuf_budget_bytes or self.target.sbuf_bytes


def _key(c: Compilation) -> str:
    c.graph, _ = ir.canonicalize(c.graph)
    c.key = cache_key(c.graph, c.target, c.options)
    return f"{len(c.graph.nodes)} nodes, {len(c.graph.inputs)} inputs, key {c.key.digest[:16]}"


def _dce(c: Compilation) -> str:
    before = len(c.graph.nodes)
    if not c.options.disable_dce:
        c.graph = eliminate_dead_code(c.graph)
    return f"{before} -> {len(c.graph.nodes)} nodes"


def _cse(c: Compilation) -> str:
    before = len(c.graph.nodes)
    if not c.options.disable_cse:
        c.graph = eliminate_common_subexpressions(c.graph)
    return f"{before} -> {len(c.graph.nodes)} nodes"


def _classify(c: Compilation) -> str:
    c.kernels = classify(c.graph, c.target, c.sbuf_budget)
    counts: dict[str, int] = {}
    for k in c.kernels:
        name = executable_pb2.InstructionClass.Name(k.klass)
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))


def _fuse(c: Compilation) -> str:
    c.groups = singletons(c.graph) if c.options.disable_fusion else fuse(c.graph, c.kernels)
    fused = [len(g) for g in c.groups if len(g) > 1]
    return (
        f"{len(c.graph.nodes)} nodes -> {len(c.groups)} kernels ({len(fused)} fused, sizes {fused})"
    )


def _memory_plan(c: Compilation) -> str:
    tiles = [k.sbuf_bytes for k in c.kernels]
    c.plan = memory_plan(c.graph, tiles, c.hbm_budget, c.sbuf_budget, c.groups)
    p = c.plan
    return (
        f"HBM scratch {p.hbm_scratch_bytes} B after reuse (unshared {p.hbm_unshared_bytes} B), "
        f"I/O {p.hbm_io_bytes} B, SBUF peak {p.sbuf_peak_bytes} B "
        f"(fused intermediates {p.sbuf_internal_bytes} B, {p.sbuf_tiles} tile(s))"
    )


def _lower(c: Compilation) -> str:
    assert c.plan is not None
    c.instructions = lower(c.graph, c.kernels, c.plan, c.target, c.groups)
    return f"{len(c.instructions)} instructions"


def _schedule(c: Compilation) -> str:
    c.makespan_ns = list_schedule(c.instructions, c.target)
    c.o1_makespan_ns = c.makespan_ns
    c.o1_work = (len(c.instructions), len(c.groups))
    return f"makespan {c.makespan_ns / 1000:.3f} us"


def opt_level(options: executable_pb2.CompileOptions) -> int:
    """-O1 (options 0 or 1: per-op kernels, fast compiles), -O2 (fused graphs), -O3."""
    if options.opt_level > 3:
        raise CompileError(f"opt_level {options.opt_level}: use 1, 2 or 3")
    return max(1, options.opt_level)


def _search(c: Compilation) -> str:
    level = opt_level(c.options)
    if level == 1:
        return "-O1: the list schedule as it is (no search)"
    assert c.plan is not None
    search = Search(c)
    baseline = Candidate(
        c.groups, [0] * len(c.groups), {}, c.makespan_ns, c.kernels, c.plan, c.instructions
    )
    best = search.run(level, baseline)
    c.schedules_searched = search.schedules + 1  # (the -O1 schedule is the first)
    if best is not baseline:
        assert best.plan is not None
        c.groups, c.kernels, c.plan = best.groups, best.kernels, best.plan
        c.instructions, c.makespan_ns = best.instructions, best.makespan_ns
    gain = 1 - c.makespan_ns / c.o1_makespan_ns if c.o1_makespan_ns else 0.0
    return (
        f"-O{level}: {c.schedules_searched} schedules and {search.estimates} kernel layouts "
        f"tried (fusion cuts, layouts {list(LAYOUTS)}, engines); kept {best.describe()}: "
        f"makespan {c.makespan_ns / 1000:.3f} us against -O1's {c.o1_makespan_ns / 1000:.3f} us "
        f"({gain:.1%} less)"
    )


def _compile_time(c: Compilation) -> str:
    # What the compiler did: the -O1 pipeline whole (the search's baseline), then the search.
    instructions, kernels = c.o1_work
    c.compile_seconds = modelled_compile_seconds(instructions, kernels, c.schedules_searched)
    return f"modelled compile time {c.compile_seconds:.2f} s"


def _emit(c: Compilation) -> str:
    assert c.plan is not None and c.key is not None
    c.executable = emit(
        c.graph,
        c.plan,
        c.instructions,
        c.makespan_ns,
        c.target,
        c.options,
        c.key.digest,
        c.debug if c.options.emit_debug_info else None,
        c.log,
        c.groups,
    )
    c.executable.modelled_compile_seconds = c.compile_seconds
    c.executable.search_schedules = c.schedules_searched
    c.executable.o1_modelled_ns = math.ceil(c.o1_makespan_ns)
    return f"{c.executable.ByteSize()} bytes"


Pass = tuple[str, Callable[[Compilation], str]]

PASSES: tuple[Pass, ...] = (
    ("canonicalize", _key),
    ("dead code elimination", _dce),
    ("common subexpression elimination", _cse),
    ("classify", _classify),
    ("fuse", _fuse),
    ("memory plan", _memory_plan),
    ("lower", _lower),
    ("list schedule", _schedule),
    ("schedule search", _search),
    ("compile time", _compile_time),
    ("emit", _emit),
)


def compile(
    graph: graph_pb2.Graph | ir.Graph,
    target: str | Target = "trn2",
    options: executable_pb2.CompileOptions | None = None,
    debug: graph_pb2.GraphDebug | None = None,
) -> executable_pb2.Executable:
    """Compiles a graph; raises CompileError (deterministic) if it cannot be compiled."""
    return run_passes(graph, target, options, debug).executable  # type: ignore[return-value]


def run_passes(
    graph: graph_pb2.Graph | ir.Graph,
    target: str | Target = "trn2",
    options: executable_pb2.CompileOptions | None = None,
    debug: graph_pb2.GraphDebug | None = None,
) -> Compilation:
    try:
        g = ir.from_proto(graph) if isinstance(graph, graph_pb2.Graph) else graph
        g.validate()
    except ir.GraphError as e:
        raise CompileError(f"malformed graph: {e}") from e
    if options is None:
        options = executable_pb2.CompileOptions()
    t = get_target(target) if isinstance(target, str) else target
    c = Compilation(g, t, options, debug)
    for name, run in PASSES:
        try:
            c.log.append(f"{name}: {run(c)}")
        except MemoryPlanError as e:
            raise GraphTooLargeError(str(e)) from e
    return c
