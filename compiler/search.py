"""Schedule search (-O2, -O3): the -O1 pipeline's schedule is one candidate, the search tries
others and keeps the one with the least modelled time (never worse than -O1's).

The choices are those neuronx-cc's release notes name (fusion, layout selection, tiling;
docs/chip.md):
- where fusion groups are cut: -O1 starts a kernel at every matmul; the other cut lets a
  matmul fed by the kernel before it join that kernel, so what comes before it (a norm, an
  activation, a residual add) reaches it through SBUF instead of a round trip through HBM;
- the layout of each kernel of elementwise work (no matmul, transpose or copy in it): how many
  partitions its tiles are spread over. Fewer partitions make longer contiguous DMA runs
  (more of the DMA bandwidth, cost_model.dma_efficiency) and slower compute (fewer lanes);
- the engine of each tensor-tensor or tensor-scalar op (lower.ENGINE_CHOICES): Vector,
  Scalar or GpSimd, so that independent work spreads over the engines.

-O2 picks each kernel's layout by that kernel's own time and the engines by balancing their
busy time, for each cut, and schedules each combination whole. -O3 then improves every
kernel's layout and every op's engine one at a time against the whole schedule (coordinate
descent) until a sweep finds nothing or the budget of schedules is spent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trnsim.compiler import op_table
from trnsim.compiler.fusion import fuse
from trnsim.compiler.graph import Value
from trnsim.compiler.lower import ENGINE_CHOICES, Instr, Kernel, _dma, kernel_for, lower
from trnsim.compiler.memory_plan import MemoryPlan, MemoryPlanError, memory_plan
from trnsim.compiler.schedule import list_schedule
from trnsim.protos import executable_pb2 as ex

if TYPE_CHECKING:
    from trnsim.compiler import Compilation

C = ex.InstructionClass
LAYOUTS = (0, 64, 32, 16)  # partitions a kernel's tiles are spread over (0: all of them)
FIXED_LAYOUT = frozenset({C.MATMUL, C.TRANSPOSE, C.DMA_COPY, C.COLLECTIVE})
O3_BUDGET = 400  # whole schedules -O3 may evaluate


@dataclass
class Candidate:
    """One schedule: the cut, each kernel's layout and the chosen engines, and what it costs."""

    groups: list[list[int]]
    layouts: list[int]
    engines: dict[int, str] = field(default_factory=dict)  # node -> engine (non-default only)
    makespan_ns: float = 0.0
    kernels: list[Kernel] = field(default_factory=list)
    plan: MemoryPlan | None = None
    instructions: list[Instr] = field(default_factory=list)

    def describe(self) -> str:
        spread = sorted({p for p in self.layouts if p}, reverse=True)
        laid = sum(1 for p in self.layouts if p)
        moved = sorted(set(self.engines.values()))
        return ", ".join(
            [
                f"{len(self.groups)} kernel(s)",
                f"{laid} laid out on fewer partitions ({', '.join(map(str, spread))})"
                if laid
                else "all on every partition",
                f"{len(self.engines)} op(s) moved to {', '.join(moved)}"
                if moved
                else "no op moved to another engine",
            ]
        )


class Search:
    def __init__(self, c: Compilation) -> None:
        self.c = c
        self.schedules = 0  # whole schedules evaluated
        self.estimates = 0  # kernel-local estimates (layout choices)
        self.users = c.graph.users()

    def kernels(
        self, groups: list[list[int]], layouts: list[int], engines: dict[int, str]
    ) -> list[Kernel]:
        """Each node's kernel under the candidate's layout and engine choices."""
        c = self.c
        out = list(c.kernels)
        for group, spread in zip(groups, layouts, strict=True):
            target = dataclasses.replace(c.target, partitions=spread) if spread else c.target
            for i in group:
                engine = engines.get(i, "")
                if spread or engine:
                    out[i] = kernel_for(c.graph, c.graph.nodes[i], target, c.sbuf_budget, engine)
        return out

    def evaluate(self, candidate: Candidate) -> Candidate | None:
        """The candidate scheduled whole; None when it does not fit (SBUF, HBM)."""
        c = self.c
        self.schedules += 1
        kernels = self.kernels(candidate.groups, candidate.layouts, candidate.engines)
        try:
            plan = memory_plan(
                c.graph,
                [k.sbuf_bytes for k in kernels],
                c.hbm_budget,
                c.sbuf_budget,
                candidate.groups,
            )
        except MemoryPlanError:
            return None
        instructions = lower(c.graph, kernels, plan, c.target, candidate.groups, candidate.layouts)
        candidate.makespan_ns = list_schedule(instructions, c.target)
        candidate.kernels, candidate.plan, candidate.instructions = kernels, plan, instructions
        return candidate

    # -- -O2's choices ----------------------------------------------------------------------
    def layout_of(self, group: list[int]) -> int:
        """The layout with the least time for this kernel alone: its transfers in and out
        and its compute, each priced on that many partitions."""
        c = self.c
        if any(c.kernels[i].klass in FIXED_LAYOUT for i in group):
            return 0
        inside = set(group)
        users = self.users
        outputs = set(c.graph.outputs)
        load = sum(
            {
                (v.node, v.index): c.graph.type_of(v).nbytes
                for i in group
                for v in c.graph.nodes[i].tensor_args()
                if v.node is None or v.node not in inside
            }.values()
        )
        store = sum(
            t.nbytes
            for i in group
            for j, t in enumerate(c.graph.nodes[i].outputs)
            if any(u not in inside for u in users.get(Value(i, j), [])) or Value(i, j) in outputs
        )
        best, best_ns = 0, float("inf")
        for spread in LAYOUTS:
            self.estimates += 1
            target = dataclasses.replace(c.target, partitions=spread) if spread else c.target
            compute = sum(
                kernel_for(c.graph, c.graph.nodes[i], target, c.sbuf_budget).cost.ns for i in group
            )
            ns = _dma(c.target, load, spread).ns + compute + _dma(c.target, store, spread).ns
            if ns < best_ns - 1e-9:
                best, best_ns = spread, ns
        return best

    def balanced_engines(self, groups: list[list[int]], layouts: list[int]) -> dict[int, str]:
        """Each movable op on the engine whose busy time, with the op, would be least (in
        program order; the fixed ops load their engines first)."""
        c = self.c
        kernels = self.kernels(groups, layouts, {})
        busy: dict[str, float] = {}
        movable = [i for i, k in enumerate(kernels) if k.klass in ENGINE_CHOICES]
        for k in kernels:
            if k.klass not in ENGINE_CHOICES and k.klass != C.VIEW:
                busy[k.engine_name] = busy.get(k.engine_name, 0.0) + k.cost.ns
        layout_of = {
            i: spread for group, spread in zip(groups, layouts, strict=True) for i in group
        }
        engines: dict[int, str] = {}
        for i in movable:
            spread = layout_of[i]
            target = dataclasses.replace(c.target, partitions=spread) if spread else c.target
            options = []
            for engine in ENGINE_CHOICES[kernels[i].klass]:
                ns = kernel_for(c.graph, c.graph.nodes[i], target, c.sbuf_budget, engine).cost.ns
                options.append(
                    (busy.get(engine, 0.0) + ns, engine != kernels[i].engine_name, engine, ns)
                )
            _, _, engine, ns = min(options)
            busy[engine] = busy.get(engine, 0.0) + ns
            if engine != op_table.ENGINE_OF_CLASS[kernels[i].klass]:
                engines[i] = engine
        return engines

    # -- the search -----------------------------------------------------------------------------
    def run(self, level: int, baseline: Candidate) -> Candidate:
        c = self.c
        best = baseline
        cuts = [baseline.groups]
        alternative = fuse(c.graph, c.kernels, prologues=True)
        if alternative != baseline.groups:
            cuts.append(alternative)
        for groups in cuts:
            layouts = [self.layout_of(g) for g in groups]
            plain = [0] * len(groups)
            tries = [
                Candidate(groups, plain),
                Candidate(groups, layouts),
                Candidate(groups, layouts, self.balanced_engines(groups, layouts)),
            ]
            for candidate in tries[1 if groups is baseline.groups else 0 :]:
                done = self.evaluate(candidate)
                if done is not None and done.makespan_ns < best.makespan_ns:
                    best = done
        if level >= 3:
            best = self.descend(best)
        return best

    def descend(self, best: Candidate) -> Candidate:
        """-O3: one kernel's layout or one op's engine changed at a time, kept when the whole
        schedule gets shorter; sweeps until one finds nothing or the budget is spent."""
        c = self.c
        improved = True
        while improved and self.schedules < O3_BUDGET:
            improved = False
            for n, group in enumerate(best.groups):
                if any(c.kernels[i].klass in FIXED_LAYOUT for i in group):
                    continue
                for spread in LAYOUTS:
                    if spread == best.layouts[n] or self.schedules >= O3_BUDGET:
                        continue
                    layouts = [*best.layouts[:n], spread, *best.layouts[n + 1 :]]
                    done = self.evaluate(Candidate(best.groups, layouts, dict(best.engines)))
                    if done is not None and done.makespan_ns < best.makespan_ns - 1e-6:
                        best, improved = done, True
            for i, k in enumerate(c.kernels):
                if k.klass not in ENGINE_CHOICES:
                    continue
                current = best.engines.get(i, op_table.ENGINE_OF_CLASS[k.klass])
                for engine in ENGINE_CHOICES[k.klass]:
                    if engine == current or self.schedules >= O3_BUDGET:
                        continue
                    engines = dict(best.engines)
                    if engine == op_table.ENGINE_OF_CLASS[k.klass]:
                        engines.pop(i, None)
                    else:
                        engines[i] = engine
                    done = self.evaluate(Candidate(best.groups, list(best.layouts), engines))
                    if done is not None and done.makespan_ns < best.makespan_ns - 1e-6:
                        best, improved = done, True
        return best
