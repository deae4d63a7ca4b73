"""How compile time and executable size grow with the graph: a chain of relus of n nodes,
compiled in process, for each n given (the compiler should stay near linear in n).

    python benchmarks/compile_scaling.py                  # 1k, 2k, 4k and 8k nodes, -O1
    python benchmarks/compile_scaling.py --nodes 1000 16000 --opt-level 2 [--no-fusion]

Seconds are wall time, CPU seconds this process's (steadier on a shared machine); MB is the
serialized executable; deps the dependencies of all its instructions.
"""

from __future__ import annotations

import argparse
import time

from trnsim import compiler
from trnsim.compiler.graph import Graph, GraphBuilder, TensorType
from trnsim.protos import executable_pb2


def relu_chain(n: int, size: int) -> Graph:
    """x -> relu -> relu -> ... n times; every intermediate dies right after its one use, so
    the memory plan reuses two scratch regions over and over."""
    b = GraphBuilder("relu_chain")
    v = b.input([size])
    for _ in range(n):
        v = b.op("aten::relu.default", v, out=TensorType.contiguous((size,), "float32"))
    return b.build(v)


def measure(
    n: int, size: int, opt_level: int, fusion: bool = True
) -> tuple[float, float, int, int, int]:
    """Wall and CPU seconds to compile a chain of n relus, the executable's bytes, its
    instructions and their dependencies. (CPU time is the steadier on a shared machine.)"""
    graph = relu_chain(n, size)
    options = executable_pb2.CompileOptions(opt_level=opt_level, disable_fusion=not fusion)
    start, cpu = time.perf_counter(), time.process_time()
    exe = compiler.compile(graph, "trn2", options)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    deps = sum(len(i.deps) for i in exe.instructions)
    return seconds, cpu, exe.ByteSize(), len(exe.instructions), deps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=[1000, 2000, 4000, 8000], help="chain lengths"
    )
    parser.add_argument("--size", type=int, default=4096, help="elements of each tensor")
    parser.add_argument(
        "--opt-level", type=int, default=1, choices=(1, 2, 3), help="compile level (default 1)"
    )
    parser.add_argument(
        "--no-fusion", action="store_true", help="one kernel per node (most memory reuse)"
    )
    args = parser.parse_args()
    fusion = "no fusion" if args.no_fusion else "fused"
    print(f"relu chain, {args.size} float32 elements a tensor, -O{args.opt_level}, {fusion}")
    print(
        f"{'nodes':>7} {'seconds':>8} {'cpu s':>8} {'MB':>8} {'instrs':>8} {'deps':>10} {'deps/node':>9}"
    )
    for n in args.nodes:
        seconds, cpu, size, instrs, deps = measure(n, args.size, args.opt_level, not args.no_fusion)
        print(
            f"{n:>7} {seconds:>8.2f} {cpu:>8.2f} {size / 1e6:>8.2f} {instrs:>8} {deps:>10} "
            f"{deps / n:>9.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
