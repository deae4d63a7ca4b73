"""Memory planning: which buffer every value lives in, lifetimes, and offsets with reuse."""

from __future__ import annotations

from dataclasses import dataclass, field

from trnsim.compiler import op_table
from trnsim.compiler.graph import Graph, Node, Value, values_in
from trnsim.compiler.intervals import Lifetimes
from trnsim.compiler.passes import broadcast_constants
from trnsim.protos import executable_pb2 as ex

ALIGNMENT = 64  # bytes; offsets in a scratch arena are multiples of this


class MemoryPlanError(ValueError):
    """Unrecoverable for this graph on this target: it needs more memory than the budget."""


@dataclass
class PlannedBuffer:
    id: int
    role: int  # ex.BufferRole
    memory: int  # ex.MemoryKind
    size: int
    value: Value | None = None
    alias_of: int | None = None
    live_from: int = 0  # first step (node index) that writes it
    live_until: int = 0  # last step that reads it
    offset: int = 0


@dataclass
class MemoryPlan:
    buffers: list[PlannedBuffer] = field(default_factory=list)
    buffer_of: dict[Value, int] = field(default_factory=dict)  # value -> buffer id
    hbm_scratch_bytes: int = 0
    hbm_unshared_bytes: int = 0
    sbuf_peak_bytes: int = 0
    hbm_io_bytes: int = 0
    sbuf_internal_bytes: int = 0
    sbuf_tiles: int = 1
    # copy_ nodes whose source was stored straight into their destination (nothing to move)
    stored_in_place: set[int] = field(default_factory=set)
    # fills of broadcast constants, folded into their consumers, and the buffers they fill
    folded: frozenset[int] = frozenset()
    constants: set[int] = field(default_factory=set)

    def root(self, buffer_id: int) -> PlannedBuffer:
        """The buffer that owns the memory of buffer_id (following ALIAS links)."""
        b = self.buffers[buffer_id]
        while b.alias_of is not None:
            b = self.buffers[b.alias_of]
        return b


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


BULK = 64  # more buffers than this with one lifetime are placed as one block


def assign_offsets(buffers: list[PlannedBuffer]) -> int:
    """Greedy by size: each buffer takes the lowest offset free for all of its lifetime.

    Two buffers whose lifetimes overlap never overlap in address. Returns the arena's peak.
    Many buffers born and dying together (a node with thousands of outputs) are laid out
    side by side as one block, so the plan stays far from quadratic in them.
    """
    by_lifetime: dict[tuple[int, int], list[PlannedBuffer]] = {}
    for b in buffers:
        by_lifetime.setdefault((b.live_from, b.live_until), []).append(b)
    blocks = {key: group for key, group in by_lifetime.items() if len(group) > BULK}
    if not blocks:
        return _first_fit(buffers)
    singles = [b for key, group in by_lifetime.items() if key not in blocks for b in group]
    stand_ins = {
        key: PlannedBuffer(-1, 0, 0, sum(_align(b.size) for b in group), None, None, *key)
        for key, group in blocks.items()
    }
    peak = _first_fit([*singles, *stand_ins.values()])
    for key, group in blocks.items():
        offset = stand_ins[key].offset
        for b in sorted(group, key=lambda b: b.id):
            b.offset = offset
            offset += _align(b.size)
    return peak


def _first_fit(buffers: list[PlannedBuffer]) -> int:
    """Largest first, each at the lowest offset clear of the buffers placed so far whose
    lifetimes meet its own (found through an index by lifetime, not a scan of all placed)."""
    if not buffers:
        return 0
    placed: Lifetimes[PlannedBuffer] = Lifetimes(
        min(b.live_from for b in buffers), max(b.live_until for b in buffers)
    )
    peak = 0
    for b in sorted(buffers, key=lambda b: (-b.size, b.live_from, b.id)):
        conflicts = sorted(
            (p.offset, p.offset + _align(p.size))
            for p in placed.overlapping(b.live_from, b.live_until)
        )
        offset = 0
        for start, end in conflicts:
            if offset + _align(b.size) <= start:
                break
            offset = max(offset, end)
        b.offset = offset
        placed.add(b, b.live_from, b.live_until)
        peak = max(peak, offset + _align(b.size))
    return peak


def run_order(n: int, groups: list[list[int]] | None) -> list[int]:
    """Per node, its step: where it runs, kernel after kernel (program order without groups)."""
    if groups is None:
        return list(range(n))
    step = [0] * n
    for k, i in enumerate(i for group in groups for i in group):
        step[i] = k
    return step


def plan_values(g: Graph, steps: list[int] | None = None) -> MemoryPlan:
    """Buffers for inputs (caller's), outputs (caller's), aliases and internal values, live
    over the steps (run_order) that make and read them."""
    steps = steps or list(range(len(g.nodes)))
    plan = MemoryPlan()
    observable = set(g.outputs)

    def add(role: int, value: Value, size: int, step: int, alias_of: int | None = None) -> None:
        b = PlannedBuffer(len(plan.buffers), role, ex.HBM, size, value, alias_of, step, step)
        plan.buffers.append(b)
        plan.buffer_of[value] = b.id

    for i, t in enumerate(g.inputs):
        add(ex.INPUT, Value(None, i), t.nbytes, -1)
    for i, node in enumerate(g.nodes):
        aliased = {a.output: a.argument for a in node.aliases}
        for j, t in enumerate(node.outputs):
            v = Value(i, j)
            if j in aliased:
                source = node.args[aliased[j]][1]
                assert isinstance(source, Value), "validated: aliases name tensors"
                add(ex.ALIAS, v, t.nbytes, steps[i], plan.buffer_of[source])
            else:
                add(ex.OUTPUT if v in observable else ex.INTERNAL, v, t.nbytes, steps[i])
    _extend_lifetimes(g, plan, steps)
    return plan


def _extend_lifetimes(g: Graph, plan: MemoryPlan, steps: list[int]) -> None:
    """Every read (also through a view) keeps the owning buffer alive; observable roots of
    observable views become OUTPUT buffers."""
    for i, node in enumerate(g.nodes):
        for v in node.tensor_args():
            root = plan.root(plan.buffer_of[v])
            root.live_until = max(root.live_until, steps[i])
    end = len(g.nodes)
    for v in g.outputs:
        root = plan.root(plan.buffer_of[v])
        root.live_until = end
        if root.role == ex.INTERNAL:
            root.role = ex.OUTPUT


def _keep_in_sbuf(g: Graph, plan: MemoryPlan, groups: list[list[int]]) -> None:
    """INTERNAL values read only inside the kernel that made them live in SBUF."""
    group_of = {n: gi for gi, nodes in enumerate(groups) for n in nodes}
    readers: dict[int, set[int]] = {}
    for i, node in enumerate(g.nodes):
        for v in node.tensor_args():
            readers.setdefault(plan.root(plan.buffer_of[v]).id, set()).add(group_of[i])
    for b in plan.buffers:
        if b.role != ex.INTERNAL or b.value is None or b.value.node is None:
            continue
        home = group_of[b.value.node]
        if readers.get(b.id, set()) <= {home} and len(groups[home]) > 1:
            b.memory = ex.SBUF


# Ops that may write their result over an operand they read (element i of the output depends
# on element i of the operands only), as XLA's buffer assignment lets elementwise ops do.
_ELEMENTWISE = frozenset({ex.TENSOR_TENSOR, ex.TENSOR_SCALAR, ex.ACTIVATION})


def _store_in_place(
    g: Graph, plan: MemoryPlan, groups: list[list[int]] | None, steps: list[int]
) -> None:
    """A copy_ of a value computed in the graph into a graph input, the value's last use (a
    functionalized graph's write-back of updated parameters and optimizer state): the
    producer stores the value straight into the input's memory, as XLA does for an output
    aliased to a donated input, and the copy moves nothing. Only when the input is neither
    read nor written between the producer and the copy (its old contents are dead by then)."""
    fused = {n for nodes in groups or [] if len(nodes) > 1 for n in nodes}
    touched = _nodes_touching(g, plan)
    for i, node in enumerate(g.nodes):
        if i in fused or node.name != "aten::copy_" or len(list(node.tensor_args())) != 2:
            continue
        dst, src = node.tensor_args()
        if dst.node is not None or src.node is None or not _same_layout(g, dst, src):
            continue
        source = plan.buffers[plan.buffer_of[src]]
        destination = plan.buffers[plan.buffer_of[dst]]
        if source.role != ex.INTERNAL or any(steps[n] > steps[i] for n in touched[source.id]):
            continue
        producer = src.node
        in_place_ok = _elementwise_over(g.nodes[producer], src.index, plan, destination.id)
        if any(
            n != i and (steps[n] > steps[producer] or (n == producer and not in_place_ok))
            for n in touched[destination.id]
        ):
            continue
        source.role, source.alias_of = ex.ALIAS, destination.id
        touched[destination.id] |= touched[source.id]
        plan.stored_in_place.add(i)


def _fold_constants(g: Graph, plan: MemoryPlan) -> None:
    """Broadcast constants (passes.broadcast_constants) are made by the kernels that read
    them: their fills store nothing and their buffers are never loaded."""
    plan.folded = broadcast_constants(g)
    for i in plan.folded:
        for v in g.nodes[i].written_values():
            plan.constants.add(plan.root(plan.buffer_of[v]).id)


def _elementwise_over(node: Node, output: int, plan: MemoryPlan, buffer: int) -> bool:
    """Whether output `output` of an elementwise node may overwrite `buffer` as it is made:
    every element of it is read only to compute the same element of that output. A foreach
    op's output j pairs with member j of its lists, so its other members must not be it."""
    if op_table.classify(node.op) not in _ELEMENTWISE:
        return False
    for _, arg in node.args:
        members = arg if isinstance(arg, tuple) else (arg,)
        for j, member in enumerate(members):
            mine = j == output if isinstance(arg, tuple) else len(node.outputs) == 1
            for v in values_in(member):
                if plan.root(plan.buffer_of[v]).id == buffer and not mine:
                    return False
    return True


def _same_layout(g: Graph, a: Value, b: Value) -> bool:
    ta, tb = g.type_of(a), g.type_of(b)
    return (ta.shape, ta.strides, ta.dtype) == (tb.shape, tb.strides, tb.dtype)


def _nodes_touching(g: Graph, plan: MemoryPlan) -> dict[int, set[int]]:
    """Per root buffer: the nodes that read or write it (through views too)."""
    touched: dict[int, set[int]] = {b.id: set() for b in plan.buffers}
    for i, node in enumerate(g.nodes):
        for v in [*node.tensor_args(), *_outputs(node, i)]:
            touched[plan.root(plan.buffer_of[v]).id].add(i)
    return touched


def _outputs(node: Node, i: int) -> list[Value]:
    return [Value(i, j) for j in range(len(node.outputs))]


def memory_plan(
    g: Graph,
    sbuf_tiles: list[int],
    hbm_budget: int,
    sbuf_budget: int,
    groups: list[list[int]] | None = None,
) -> MemoryPlan:
    """Plans HBM for the graph's values, SBUF for fused intermediates and for each node's
    staging tiles. sbuf_tiles[i] is the SBUF working set node i needs (double-buffered).

    Fused intermediates that do not fit SBUF are tiled: each kernel runs in `sbuf_tiles`
    passes over slices of its data, so a slice of every intermediate is live at a time.
    """
    steps = run_order(len(g.nodes), groups)
    plan = plan_values(g, steps)
    _fold_constants(g, plan)
    _store_in_place(g, plan, groups, steps)
    if groups is not None:
        _keep_in_sbuf(g, plan, groups)
    internal = [b for b in plan.buffers if b.role == ex.INTERNAL and b.memory == ex.HBM]
    plan.hbm_scratch_bytes = assign_offsets(internal)
    plan.hbm_unshared_bytes = sum(_align(b.size) for b in internal)
    plan.hbm_io_bytes = sum(b.size for b in plan.buffers if b.role in (ex.INPUT, ex.OUTPUT))
    tiles = [
        PlannedBuffer(-1, ex.INTERNAL, ex.SBUF, size, live_from=i, live_until=i)
        for i, size in enumerate(sbuf_tiles)
        if size
    ]
    resident = [b for b in plan.buffers if b.role == ex.INTERNAL and b.memory == ex.SBUF]
    full = {b.id: b.size for b in resident}
    while True:
        plan.sbuf_internal_bytes = assign_offsets(resident)
        plan.sbuf_peak_bytes = assign_offsets([*resident, *tiles])
        if plan.sbuf_peak_bytes <= sbuf_budget or not resident or plan.sbuf_tiles >= 1 << 20:
            break
        plan.sbuf_tiles *= 2  # halve every resident slice and plan again
        for b in resident:
            b.size = max(ALIGNMENT, -(-full[b.id] // plan.sbuf_tiles))
    need = plan.hbm_scratch_bytes + plan.hbm_io_bytes
    if need > hbm_budget:
        raise MemoryPlanError(
            f"the graph needs {need} bytes of HBM ({plan.hbm_scratch_bytes} internal + "
            f"{plan.hbm_io_bytes} inputs/outputs), over the budget of {hbm_budget} bytes; "
            f"split the graph or use smaller tensors"
        )
    if plan.sbuf_peak_bytes > sbuf_budget:
        largest = max(sbuf_tiles)
        raise MemoryPlanError(
            f"staging tiles need {plan.sbuf_peak_bytes} bytes of SBUF (largest node "
            f"{largest}), over the budget of {sbuf_budget} bytes"
        )
    return plan
