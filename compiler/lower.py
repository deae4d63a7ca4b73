"""Lowering: each node becomes engine instructions (load, compute, store) priced by the
simulator's cost model, with data and memory-reuse dependencies between them."""

from __future__ import annotations

from dataclasses import dataclass, field

from trnsim.compiler import op_table
from trnsim.compiler.graph import Graph, Node, TensorType, Value, values_in
from trnsim.compiler.intervals import AddressMap
from trnsim.compiler.memory_plan import MemoryPlan, PlannedBuffer
from trnsim.protos import executable_pb2 as ex
from trnsim.simulator import cost_model, dtypes
from trnsim.simulator.config import Target
from trnsim.simulator.cost_model import Cost

C = ex.InstructionClass
ENGINE_ENUM = {
    "tensor": ex.TENSOR,
    "vector": ex.VECTOR,
    "scalar": ex.SCALAR,
    "gpsimd": ex.GPSIMD,
    "dma": ex.DMA,
    "none": ex.NONE,
}


@dataclass
class Kernel:
    """What one node costs: its class, its compute cost, flops, and bytes it moves."""

    klass: int
    cost: Cost
    flops: int = 0
    load_bytes: int = 0
    store_bytes: int = 0
    sbuf_bytes: int = 0
    engine: str = ""  # the engine chosen by the schedule search ("": the class's own)

    @property
    def engine_name(self) -> str:
        return self.engine or op_table.ENGINE_OF_CLASS[self.klass]


@dataclass
class Instr:
    id: int
    engine: str
    klass: int
    cost: Cost
    nodes: list[int] = field(default_factory=list)
    reads: list[int] = field(default_factory=list)
    writes: list[int] = field(default_factory=list)
    deps: dict[int, bool] = field(default_factory=dict)  # producer id -> streamed
    flops: int = 0
    nbytes: int = 0
    # Filled by the scheduler.
    start_ns: float = 0.0
    end_ns: float = 0.0


def read_values(node: Node) -> list[Value]:
    """The tensors the node reads: all its tensor arguments but a destination it overwrites
    whole (copy_, fill_, zero_ write their destination without reading it)."""
    if not op_table.overwrites_destination(node.op):
        return list(node.tensor_args())
    written = {a.argument for a in node.aliases if a.writes} | set(node.mutated_args)
    return [v for k, (_, arg) in enumerate(node.args) if k not in written for v in values_in(arg)]


def _tensor_types(g: Graph, node: Node) -> list[TensorType]:
    return [g.type_of(v) for v in read_values(node)]


def _low_precision(types: list[TensorType]) -> bool:
    return bool(types) and all(dtypes.is_low_precision(t.dtype) for t in types)


def _tile_bytes(t: TensorType, target: Target) -> int:
    return min(t.nbytes, target.partitions * cost_model.TILE_ELEMENTS_PER_PARTITION * t.itemsize)


def _staging_bytes(g: Graph, node: Node, ins: list[TensorType], target: Target) -> int:
    """SBUF for one step of the kernel, double-buffered: a tile of every operand. A foreach
    op steps through its lists one index at a time, so only the i-th members of its lists
    (and its plain tensor operands) are staged together."""
    if not node.name.startswith("aten::_foreach_"):
        return 2 * sum(_tile_bytes(t, target) for t in [*ins, *node.outputs])
    per_index: dict[int, int] = {}
    common = 0
    for _, value in node.args:
        if isinstance(value, tuple):
            for i, item in enumerate(value):
                for v in values_in(item):
                    per_index[i] = per_index.get(i, 0) + _tile_bytes(g.type_of(v), target)
        else:
            common += sum(_tile_bytes(g.type_of(v), target) for v in values_in(value))
    length = max(len(per_index), 1)
    for j, t in enumerate(node.outputs):
        per_index[j % length] = per_index.get(j % length, 0) + _tile_bytes(t, target)
    return 2 * (max(per_index.values(), default=0) + common)


def gemm_reload_bytes(shape: op_table.GemmShape, itemsize: int, sbuf_budget: int) -> int:
    """HBM bytes a blocked GEMM reads beyond each operand once. The kernel keeps panels of one
    operand in half of SBUF and streams the other past them (per batch item): when the
    smaller operand fits, each is read once; otherwise the streamed one is read again for
    every further panel of the resident one, whichever way round reads less."""
    a = shape.m * shape.k * itemsize
    b = shape.k * shape.n * itemsize
    half = sbuf_budget // 2
    if min(a, b) <= half:
        return 0
    panel = max(128, half // max(1, shape.k * itemsize) // 128 * 128)  # rows (or columns)
    keep_a = b * (-(-shape.m // panel) - 1)
    keep_b = a * (-(-shape.n // panel) - 1)
    return shape.batch * min(keep_a, keep_b)


# Elementwise classes an engine other than their own can run (the schedule search's engine
# choices): a tensor-tensor or tensor-scalar pass on GpSimd, a tensor-scalar one on the
# Scalar engine's activation path (scale and bias with the identity function).
ENGINE_CHOICES: dict[int, tuple[str, ...]] = {
    C.TENSOR_TENSOR: ("vector", "gpsimd"),
    C.TENSOR_SCALAR: ("vector", "scalar", "gpsimd"),
}


def kernel_for(g: Graph, node: Node, target: Target, sbuf_budget: int, engine: str = "") -> Kernel:
    """What the node costs on `target` (the search passes a target narrowed to fewer
    partitions for a kernel laid out on them), on `engine` when one is chosen."""
    klass = op_table.classify(node.op)
    ins = _tensor_types(g, node)
    in_bytes = sum(t.nbytes for t in ins)
    out_bytes = sum(t.nbytes for j, t in enumerate(node.outputs) if not _is_view_output(node, j))
    written = sum(g.type_of(v).nbytes for v in _written_args(node))
    out_elems = max((t.numel for t in node.outputs), default=0)
    in_elems = max((t.numel for t in ins), default=0)
    low = _low_precision(ins or list(node.outputs))
    sbuf = _staging_bytes(g, node, ins, target)
    if node.cost is not None:  # a custom kernel that declared its cost
        c = node.cost
        ghz = {"tensor": target.tensor_ghz, "vector": target.vector_ghz}.get(
            c.engine, target.scalar_ghz if c.engine == "scalar" else target.gpsimd_ghz
        )
        declared = Cost(c.engine, int(c.ns * ghz), c.ns, c.ns)
        return Kernel(klass, declared, c.flops, c.hbm_bytes, out_bytes + written, sbuf, c.engine)
    if klass == C.VIEW:
        return Kernel(klass, Cost.zero())
    if klass in (C.DMA_COPY, C.COLLECTIVE):
        nbytes = in_bytes + out_bytes + written
        return Kernel(klass, cost_model.dma(target, nbytes), 0, nbytes, 0, 0)
    if klass == C.MATMUL:
        shapes = op_table.gemm_shapes(
            node.op, [t.shape for t in ins], [t.shape for t in node.outputs]
        )
        costs = [cost_model.matmul(target, s.m, s.k, s.n, low, s.batch) for s in shapes]
        itemsize = ins[0].itemsize if ins else 4
        traffic = in_bytes + sum(gemm_reload_bytes(s, itemsize, sbuf_budget) for s in shapes)
        cost = Cost(
            "tensor",
            sum(c.cycles for c in costs),
            sum(c.ns for c in costs),
            costs[0].first_tile_ns,
            sum(c.tiles for c in costs),
        )
        sbuf = min(sbuf_budget // 2, traffic) + 2 * sum(
            _tile_bytes(t, target) for t in node.outputs
        )
        flops = sum(s.flops for s in shapes)
        return Kernel(klass, cost, flops, traffic, out_bytes + written, sbuf)
    if engine and engine != op_table.ENGINE_OF_CLASS[klass]:
        cost = _cost_on(engine, target, max(in_elems, out_elems))
    else:
        engine = ""
        cost = _elementwise_cost(klass, node, target, in_elems, out_elems, low)
    return Kernel(
        klass, cost, max(in_elems, out_elems), in_bytes, out_bytes + written, sbuf, engine
    )


def _cost_on(engine: str, target: Target, elements: int) -> Cost:
    """An elementwise pass on an engine other than its class's (see ENGINE_CHOICES)."""
    if engine == "gpsimd":
        return cost_model.gpsimd(target, elements)
    if engine == "scalar":
        return cost_model.activation(target, elements)
    raise ValueError(f"no elementwise pass on the {engine} engine")


def _elementwise_cost(
    klass: int, node: Node, target: Target, in_elems: int, out_elems: int, low: bool
) -> Cost:
    if klass == C.TENSOR_TENSOR:
        return cost_model.tensor_tensor(target, out_elems, low)
    if klass == C.TENSOR_SCALAR:
        return cost_model.tensor_scalar(target, out_elems)
    if klass == C.ACTIVATION:
        if op_table.base_name(node.op) in op_table.RECIPROCAL_OPS:
            return cost_model.reciprocal(target, out_elems)
        return cost_model.activation(target, out_elems)
    if klass == C.REDUCTION:
        return cost_model.reduction(target, in_elems, low)
    if klass == C.NORMALIZATION:
        return cost_model.normalization(target, max(in_elems, out_elems))
    if klass == C.GPSIMD_OP:
        return cost_model.gpsimd(target, max(in_elems, out_elems))
    if klass == C.TRANSPOSE:
        shape = node.outputs[0].shape if node.outputs else (1,)
        rows = shape[-2] if len(shape) >= 2 else 1
        return cost_model.transpose(target, rows, shape[-1] if shape else 1)
    # GENERIC: an op the table does not know, priced as a tensor-tensor pass over its data.
    return cost_model.tensor_tensor(target, max(in_elems, out_elems), low)


def _is_view_output(node: Node, output: int) -> bool:
    return any(a.output == output for a in node.aliases)


def _written_args(node: Node) -> list[Value]:
    return list(node.written_values())


def classify(g: Graph, target: Target, sbuf_budget: int) -> list[Kernel]:
    return [kernel_for(g, node, target, sbuf_budget) for node in g.nodes]


class Builder:
    """Appends instructions and derives dependencies from the buffers they touch."""

    def __init__(self, plan: MemoryPlan) -> None:
        self.plan = plan
        self.instrs: list[Instr] = []
        self.last_writer: dict[int, int] = {}  # root buffer -> instruction
        self.readers: dict[int, list[int]] = {}  # root buffer -> instructions since the write

    def add(
        self,
        engine: str,
        klass: int,
        cost: Cost,
        node: int | None,
        reads: list[int],
        writes: list[int],
        streamed_from: int | None = None,
    ) -> Instr:
        ins = Instr(len(self.instrs), engine, klass, cost, [] if node is None else [node])
        ins.reads, ins.writes = sorted(set(reads)), sorted(set(writes))
        if streamed_from is not None:
            ins.deps[streamed_from] = True
        for b in ins.reads:
            self._dep(ins, self.last_writer.get(self.plan.root(b).id))
        for b in ins.writes:
            root = self.plan.root(b).id
            self._dep(ins, self.last_writer.get(root))
            for reader in self.readers.get(root, []):
                self._dep(ins, reader)
        for b in ins.reads:
            self.readers.setdefault(self.plan.root(b).id, []).append(ins.id)
        for b in ins.writes:
            root = self.plan.root(b).id
            self.last_writer[root] = ins.id
            self.readers[root] = []
        self.instrs.append(ins)
        return ins

    @staticmethod
    def _dep(ins: Instr, producer: int | None) -> None:
        if producer is not None and producer != ins.id and producer not in ins.deps:
            ins.deps[producer] = False


def lower(
    g: Graph,
    kernels: list[Kernel],
    plan: MemoryPlan,
    target: Target,
    groups: list[list[int]] | None = None,
    layouts: list[int] | None = None,
) -> list[Instr]:
    """Instructions for every kernel (a group of nodes), in program order, with their
    dependencies. A one-node kernel loads its inputs, computes and stores its outputs; a
    fused kernel loads what comes from HBM once, chains its nodes through SBUF and stores
    only what leaves it. layouts[k]: the partitions kernel k's transfers are spread over
    (0: all of them; fewer make longer contiguous runs, chosen by the schedule search)."""
    b = build(g, kernels, plan, target, groups, layouts)
    _add_reuse_deps(b, plan)
    return b.instrs


def build(
    g: Graph,
    kernels: list[Kernel],
    plan: MemoryPlan,
    target: Target,
    groups: list[list[int]] | None = None,
    layouts: list[int] | None = None,
) -> Builder:
    """The instructions with their data dependencies, before memory-reuse ones (lower)."""
    b = Builder(plan)
    in_sbuf = {x.id for x in plan.buffers if x.memory == ex.SBUF}
    for n, group in enumerate(groups or [[i] for i in range(len(g.nodes))]):
        spread = layouts[n] if layouts else 0
        if len(group) == 1:
            _lower_node(b, g, group[0], kernels[group[0]], plan, target, spread)
        else:
            _lower_group(b, g, group, kernels, plan, target, in_sbuf, spread)
    return b


def _node_buffers(g: Graph, i: int, plan: MemoryPlan) -> tuple[list[int], list[int]]:
    node = g.nodes[i]
    reads = [plan.buffer_of[v] for v in read_values(node)]
    writes = [plan.buffer_of[Value(i, j)] for j in range(len(node.outputs))]
    writes += [plan.buffer_of[v] for v in _written_args(node)]
    return reads, writes


def _dma(target: Target, nbytes: int, spread: int) -> Cost:
    """A transfer spread over `spread` partitions (0: all of the target's)."""
    if not spread or nbytes <= 0:
        return cost_model.dma(target, nbytes)
    return cost_model.dma(target, nbytes, contiguous_bytes=-(-nbytes // spread))


def _lower_node(
    b: Builder, g: Graph, i: int, k: Kernel, plan: MemoryPlan, target: Target, spread: int = 0
) -> None:
    reads, writes = _node_buffers(g, i, plan)
    if k.klass == C.VIEW:
        writes = [w for w in writes if plan.buffers[w].role != ex.ALIAS]
        b.add("none", k.klass, k.cost, i, reads, writes)
        return
    if i in plan.stored_in_place or i in plan.folded:  # nothing moves, nothing is computed
        b.add("none", k.klass, Cost.zero(), i, reads, [])
        return
    if k.klass in (C.DMA_COPY, C.COLLECTIVE):
        b.add("dma", k.klass, k.cost, i, reads, writes).nbytes = k.load_bytes
        return
    load = None
    # A broadcast constant is made in the kernel, not loaded.
    constant = sum(plan.buffers[r].size for r in reads if plan.root(r).id in plan.constants)
    load_bytes = max(0, k.load_bytes - constant)
    if load_bytes:
        load = b.add("dma", C.DMA_LOAD, _dma(target, load_bytes, spread), None, reads, [])
        load.nbytes = load_bytes
    compute = b.add(k.engine_name, k.klass, k.cost, i, reads, [], None if load is None else load.id)
    compute.flops = k.flops
    compute.nbytes = load_bytes + k.store_bytes
    store_cost = _dma(target, k.store_bytes, spread)
    store = b.add("dma", C.DMA_STORE, store_cost, None, [], writes, compute.id)
    store.nbytes = k.store_bytes


def _lower_group(
    b: Builder,
    g: Graph,
    group: list[int],
    kernels: list[Kernel],
    plan: MemoryPlan,
    target: Target,
    in_sbuf: set[int],
    spread: int = 0,
) -> None:
    """One fused kernel; in_sbuf: the buffers kept in SBUF."""
    inside = set(group)
    external: list[int] = []
    reloads = 0
    for i in group:
        node, k = g.nodes[i], kernels[i]
        if k.klass == C.VIEW:  # a view moves nothing: whoever reads through it loads
            continue
        outside = [v for v in read_values(node) if _made_outside(g, v, inside)]
        external += [
            plan.buffer_of[v]
            for v in outside
            if plan.root(plan.buffer_of[v]).id not in plan.constants
        ]
        if k.klass == C.MATMUL:  # blocked GEMMs re-read operand panels beyond one pass
            reloads += max(0, k.load_bytes - sum(g.type_of(v).nbytes for v in node.tensor_args()))
    # Each tensor from outside the kernel comes in from HBM once, however many nodes read it.
    roots = {plan.root(b).id: plan.root(b) for b in external}
    load_bytes = sum(r.size for r in roots.values()) + reloads
    load = None
    if load_bytes:
        load = b.add("dma", C.DMA_LOAD, _dma(target, load_bytes, spread), None, external, [])
        load.nbytes = load_bytes
    leaving: list[int] = []
    store_bytes = 0
    previous = load
    for i in group:
        k = kernels[i]
        reads, writes = _node_buffers(g, i, plan)
        resident = [w for w in writes if plan.root(w).id in in_sbuf]
        leaving += [w for w in writes if plan.root(w).id not in in_sbuf]
        if i in plan.folded:
            b.add("none", k.klass, Cost.zero(), i, reads, [])
            continue
        store_bytes += _group_store_bytes(g, i, plan, in_sbuf)
        engine, cost = _in_kernel(g, i, k, inside, target)
        compute = b.add(
            engine, k.klass, cost, i, reads, resident, None if previous is None else previous.id
        )
        compute.flops = k.flops
        compute.nbytes = k.load_bytes + k.store_bytes
        if engine != "none":
            previous = compute
    if leaving and previous is not None:
        store = b.add(
            "dma", C.DMA_STORE, _dma(target, store_bytes, spread), None, [], leaving, previous.id
        )
        store.nbytes = store_bytes


def _made_outside(g: Graph, v: Value, inside: set[int]) -> bool:
    """Whether value v comes from outside the kernel: from a graph input or a node outside
    it, also when it reaches the kernel through views (which compute nothing)."""
    while v.node is not None and v.node in inside:
        node = g.nodes[v.node]
        alias = next((a for a in node.aliases if a.output == v.index), None)
        if alias is None or alias.writes or op_table.classify(node.op) != C.VIEW:
            return False
        source = node.args[alias.argument][1]
        assert isinstance(source, Value), "validated: aliases name tensors"
        v = source
    return True


def _group_store_bytes(g: Graph, i: int, plan: MemoryPlan, in_sbuf: set[int]) -> int:
    """What node i of a fused kernel sends to HBM: its outputs that are not views and not
    kept in SBUF (a value stored into another buffer's memory included), and the tensors it
    writes in place, each once."""
    node = g.nodes[i]
    total = 0
    for j in range(len(node.outputs)):
        w = plan.buffer_of[Value(i, j)]
        if not _is_view_output(node, j) and plan.root(w).id not in in_sbuf:
            total += plan.buffers[w].size
    for v in _written_args(node):
        if plan.root(plan.buffer_of[v]).id not in in_sbuf:
            total += g.type_of(v).nbytes
    return total


def _in_kernel(g: Graph, i: int, k: Kernel, inside: set[int], target: Target) -> tuple[str, Cost]:
    """The engine and cost of node i inside a fused kernel. A copy there moves no data of its
    own: what it reads came in with the kernel's load (or was computed in the kernel) and what
    it writes leaves with the kernel's store. Copying a value the kernel computed is the
    producer writing its result in the destination's type (engines convert on write, free);
    copying a loaded value is one pass over it on the Vector engine."""
    if k.klass == C.VIEW:
        return "none", k.cost
    if k.klass != C.DMA_COPY:
        return k.engine_name, k.cost
    sources = read_values(g.nodes[i])
    if sources and all(v.node is not None and v.node in inside for v in sources):
        return "none", Cost.zero()
    elements = max((t.numel for t in g.nodes[i].outputs), default=0)
    return "vector", cost_model.tensor_scalar(target, elements)


def _add_reuse_deps(b: Builder, plan: MemoryPlan) -> None:
    """A buffer placed where earlier ones lived is written only after their last accesses.

    Each write into a buffer waits for the earlier buffers still visible in its address
    range (previous_occupants) at their frontier: their last writer before it and the reads
    since. Everything else the rule "after every earlier access of every buffer that lived
    there" names is already ordered before those through the builder's dependencies (an
    access before the last write comes before that write; a buffer hidden behind a later
    one comes before that one's writes), so the schedule is the same with a bounded number
    of dependencies per instruction instead of one per earlier access (quadratic in the
    graph). A streamed dependency orders only starts, not ends, so up the chain of
    instructions a write is streamed from, the nearest one that touched a buffer that lived
    there is kept too (_streamed_accesses). tests/compiler/test_lower.py checks the schedule
    against the exhaustive rule's."""
    previous = previous_occupants(plan)
    if not previous:
        return
    frontier = _Frontier(plan)
    for ins in b.instrs:
        roots = {plan.root(w).id for w in ins.writes}
        news = [plan.buffers[n] for n in sorted(roots) if n in previous]
        for new in news:
            for old in previous[new.id]:
                for producer in frontier.last_accesses(old):
                    b._dep(ins, producer)
        if news:
            for producer in _streamed_accesses(b.instrs, ins, news, plan):
                b._dep(ins, producer)
        frontier.record(ins)


def _overlap(a: PlannedBuffer, b: PlannedBuffer) -> bool:
    return a.offset < b.offset + b.size and b.offset < a.offset + a.size


def previous_occupants(plan: MemoryPlan) -> dict[int, list[int]]:
    """Per sized INTERNAL buffer: the sized INTERNAL buffers that died before it was made
    and that are still visible in its address range (not covered since by a later one).
    Offsets of HBM and SBUF are compared alike, as the rule always has (a conservative
    order between the two memories); each memory keeps its own map of occupants, since
    only within one memory do buffers sharing addresses never share lifetimes."""
    internal = [x for x in plan.buffers if x.role == ex.INTERNAL and x.size]
    by_death = sorted(internal, key=lambda x: (x.live_until, x.id))
    maps: dict[int, AddressMap] = {}
    found: dict[int, list[int]] = {}
    dead = 0
    for new in sorted(internal, key=lambda x: (x.live_from, x.id)):
        while dead < len(by_death) and by_death[dead].live_until < new.live_from:
            old = by_death[dead]
            maps.setdefault(old.memory, AddressMap()).paint(
                old.offset, old.offset + old.size, old.id
            )
            dead += 1
        olds = [o for m in maps.values() for o in m.occupants(new.offset, new.offset + new.size)]
        if olds:
            found[new.id] = list(dict.fromkeys(olds))
    return found


class _Frontier:
    """The builder's view of each root buffer, replayed in program order: its last writer
    and the instructions that read it since."""

    def __init__(self, plan: MemoryPlan) -> None:
        self.plan = plan
        self.last_writer: dict[int, int] = {}
        self.readers: dict[int, list[int]] = {}

    def last_accesses(self, root: int) -> list[int]:
        writer = self.last_writer.get(root)
        readers = self.readers.get(root, [])
        return readers if writer is None else [writer, *readers]

    def record(self, ins: Instr) -> None:
        for r in ins.reads:
            self.readers.setdefault(self.plan.root(r).id, []).append(ins.id)
        for w in ins.writes:
            root = self.plan.root(w).id
            self.last_writer[root] = ins.id
            self.readers[root] = []


def _streamed_accesses(
    instrs: list[Instr], ins: Instr, news: list[PlannedBuffer], plan: MemoryPlan
) -> list[int]:
    """The instruction ins must also wait for, beyond its frontier dependencies: the nearest
    one up its chain of streamed producers (past the first, whose streamed dependency stays)
    that touches a buffer dead before one of `news` and sharing addresses with it. A
    streamed edge orders starts, not ends, so the chain does not order that one's end before
    ins. The walk stops early where an instruction after it on the chain (or ins) already
    waits for its end: then it, and all before it on the chain, are ordered already."""
    producer = _streamed_from(ins)
    member = None if producer is None else _streamed_from(instrs[producer])
    waited = {p for p, streamed in ins.deps.items() if not streamed}
    if producer is not None:
        waited.update(p for p, streamed in instrs[producer].deps.items() if not streamed)
    while member is not None and member not in waited:
        m = instrs[member]
        if _touches_dead(m, news, plan):
            return [member]
        waited.update(p for p, streamed in m.deps.items() if not streamed)
        member = _streamed_from(m)
    return []


def _touches_dead(m: Instr, news: list[PlannedBuffer], plan: MemoryPlan) -> bool:
    """Whether m reads or writes a sized INTERNAL buffer that died before one of `news` was
    made and shares addresses with it (the reuse rule's earlier accesses)."""
    latest = max(n.live_from for n in news)
    for x in [*m.reads, *m.writes]:
        old = plan.root(x)
        if old.role != ex.INTERNAL or not old.size or old.live_until >= latest:
            continue
        if any(old.live_until < n.live_from and _overlap(old, n) for n in news):
            return True
    return False


def _streamed_from(ins: Instr) -> int | None:
    return next((p for p, streamed in ins.deps.items() if streamed), None)
