"""`python -m trnsim.compiler --explain GRAPH.json`: the passes, instructions per engine,
modelled time and peak memory of a hand-written graph."""

from __future__ import annotations

import argparse
import sys

from trnsim.compiler import CompileError, run_passes
from trnsim.compiler.graph import GraphError, load_json
from trnsim.protos import executable_pb2 as ex
from trnsim.simulator.config import TARGETS, UnknownTargetError


def explain(path: str, target: str, sbuf_budget: int, hbm_budget: int, level: int = 2) -> str:
    options = ex.CompileOptions(
        sbuf_budget_bytes=sbuf_budget, hbm_budget_bytes=hbm_budget, opt_level=level
    )
    c = run_passes(load_json(path), target, options)
    exe = c.executable
    assert exe is not None
    lines = [
        (
            f"graph {c.graph.name or path} on {target} at -O{max(1, level)} "
            f"(compiler {exe.compiler_version})"
        ),
        "",
    ]
    lines += ["passes:"] + [f"  {i + 1}. {entry}" for i, entry in enumerate(c.log)]
    lines += ["", "instructions per engine:"]
    for program in exe.engines:
        engine = ex.Engine.Name(program.engine)
        lines.append(
            f"  {engine:<7} {len(program.instructions):>3} instr, busy {program.busy_ns / 1000:9.3f} us"
        )
        for iid in program.instructions:
            ins = exe.instructions[iid]
            ops = ", ".join(op.op for op in ins.ops) or "-"
            deps = ",".join(f"{d.instruction}{'~' if d.streamed else ''}" for d in ins.deps)
            lines.append(
                f"    #{ins.id:<3} {ex.InstructionClass.Name(ins.klass):<13} "
                f"start {ins.start_ns / 1000:9.3f} us  dur {ins.duration_ns / 1000:9.3f} us  "
                f"{ops}  deps [{deps}]"
            )
    mp = exe.memory_plan
    tflops = exe.flops / exe.modelled_ns / 1000 if exe.modelled_ns else 0.0
    lines += [
        "",
        (
            f"modelled time: {exe.modelled_ns / 1000:.3f} us per launch "
            f"(+ {TARGETS[target].launch_overhead_ns / 1000:.1f} us launch overhead); "
            f"-O1's: {exe.o1_modelled_ns / 1000:.3f} us"
        ),
        (
            f"modelled compile time: {exe.modelled_compile_seconds:.2f} s "
            f"({exe.search_schedules} schedules searched)"
        ),
        f"work: {exe.flops} FLOP ({tflops:.2f} TFLOPS), {exe.hbm_bytes} HBM bytes moved",
        (
            f"peak memory: HBM scratch {mp.hbm_scratch_bytes} B "
            f"(without reuse {mp.hbm_unshared_bytes} B), "
            f"inputs+outputs {mp.hbm_io_bytes} B, SBUF {mp.sbuf_peak_bytes} B"
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trnsim.compiler", description=__doc__)
    parser.add_argument("--explain", metavar="GRAPH.json", required=True)
    parser.add_argument("--target", default="trn2", choices=sorted(TARGETS))
    parser.add_argument("--sbuf-budget", type=int, default=0, help="bytes (0: the target's)")
    parser.add_argument("--hbm-budget", type=int, default=0, help="bytes (0: the target's)")
    parser.add_argument(
        "-O", dest="level", type=int, default=2, choices=(1, 2, 3), help="level (default 2)"
    )
    args = parser.parse_args(argv)
    try:
        print(explain(args.explain, args.target, args.sbuf_budget, args.hbm_budget, args.level))
    except (CompileError, GraphError, UnknownTargetError, OSError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
