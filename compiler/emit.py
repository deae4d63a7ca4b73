"""Emission: the scheduled instructions and the memory plan as an Executable proto."""

from __future__ import annotations

import math

from trnsim.compiler.graph import (
    Graph,
    Value,
    node_to_proto,
    to_proto,
    type_to_proto,
    value_to_proto,
)
from trnsim.compiler.keys import DEBUG_ONLY_OPTIONS
from trnsim.compiler.lower import ENGINE_ENUM, Instr
from trnsim.compiler.memory_plan import MemoryPlan
from trnsim.compiler.version import FORMAT_VERSION, compiler_version
from trnsim.protos import executable_pb2 as ex
from trnsim.protos import graph_pb2
from trnsim.simulator.config import Target

_CLOCK = {
    "tensor": "tensor_ghz",
    "vector": "vector_ghz",
    "scalar": "scalar_ghz",
    "gpsimd": "gpsimd_ghz",
}


def _buffer_proto(plan: MemoryPlan, b_id: int, g: Graph) -> ex.Buffer:
    b = plan.buffers[b_id]
    p = ex.Buffer(
        id=b.id,
        role=b.role,  # type: ignore[arg-type]
        memory=b.memory,  # type: ignore[arg-type]
        size_bytes=b.size,
        offset=b.offset,
        live_from=max(b.live_from, 0),
        live_until=max(b.live_until, 0),
    )
    if b.value is not None:
        p.value.CopyFrom(value_to_proto(b.value))
        p.type.CopyFrom(type_to_proto(g.type_of(b.value)))
    if b.alias_of is not None:
        p.alias_of = b.alias_of
    return p


def _instruction_proto(ins: Instr, g: Graph, target: Target) -> ex.Instruction:
    ghz = getattr(target, _CLOCK[ins.engine]) if ins.engine in _CLOCK else 1.0
    return ex.Instruction(
        id=ins.id,
        engine=ENGINE_ENUM[ins.engine],
        klass=ins.klass,  # type: ignore[arg-type]
        ops=[node_to_proto(g.nodes[n]) for n in ins.nodes],
        nodes=ins.nodes,
        deps=[ex.Dependency(instruction=p, streamed=s) for p, s in sorted(ins.deps.items())],
        reads=ins.reads,
        writes=ins.writes,
        cycles=ins.cost.cycles if ins.engine in _CLOCK else math.ceil(ins.cost.ns * ghz),
        duration_ns=math.ceil(ins.end_ns - ins.start_ns),
        first_tile_ns=math.ceil(ins.cost.first_tile_ns),
        start_ns=math.floor(ins.start_ns),
        flops=ins.flops,
        bytes=ins.nbytes,
    )


def emit(
    g: Graph,
    plan: MemoryPlan,
    instrs: list[Instr],
    makespan_ns: float,
    target: Target,
    options: ex.CompileOptions,
    cache_key: str,
    debug: graph_pb2.GraphDebug | None,
    pass_log: list[str],
    groups: list[list[int]] | None = None,
) -> ex.Executable:
    exe = ex.Executable(
        format_version=FORMAT_VERSION,
        compiler_version=compiler_version(),
        target=target.name,
        cache_key=cache_key,
        modelled_ns=math.ceil(makespan_ns),
        flops=sum(i.flops for i in instrs),
        hbm_bytes=sum(i.nbytes for i in instrs if i.engine == "dma"),
    )
    exe.graph.CopyFrom(to_proto(g))
    exe.node_origin.extend(g.origin or range(len(g.nodes)))
    exe.options.CopyFrom(options)
    for name in DEBUG_ONLY_OPTIONS:  # how it was compiled, not what: the same for everyone
        exe.options.ClearField(name)
    exe.input_buffers.extend(plan.buffer_of[Value(None, i)] for i in range(len(g.inputs)))
    exe.output_buffers.extend(plan.buffer_of[v] for v in g.outputs)
    mp = exe.memory_plan
    mp.buffers.extend(_buffer_proto(plan, b.id, g) for b in plan.buffers)
    mp.hbm_scratch_bytes = plan.hbm_scratch_bytes
    mp.hbm_unshared_bytes = plan.hbm_unshared_bytes
    mp.sbuf_peak_bytes = plan.sbuf_peak_bytes
    mp.hbm_io_bytes = plan.hbm_io_bytes
    mp.sbuf_internal_bytes = plan.sbuf_internal_bytes
    mp.sbuf_tiles = plan.sbuf_tiles
    exe.kernels.extend(ex.FusedKernel(nodes=group) for group in groups or [])
    exe.instructions.extend(_instruction_proto(i, g, target) for i in instrs)
    for name, enum in ENGINE_ENUM.items():
        mine = sorted((i for i in instrs if i.engine == name), key=lambda i: (i.start_ns, i.id))
        if mine:
            exe.engines.append(
                ex.EngineProgram(
                    engine=enum,
                    instructions=[i.id for i in mine],
                    busy_ns=math.ceil(sum(i.cost.ns for i in mine)),
                )
            )
    if debug is not None:
        exe.debug.graph.CopyFrom(debug)
    exe.debug.instructions.extend(
        ex.InstructionDebug(instruction=i.id, nodes=i.nodes) for i in instrs if i.nodes
    )
    exe.debug.passes.extend(pass_log)
    return exe
