"""How compile time and executable size grow with the graph: a chain of relus of n nodes,
compiled in process, for each n given (the compiler should stay near linear in n).

    python benchmarks/compile_scaling.py                  # 1k, 2k, 4k and 8k nodes, -O1
    python benchmarks/compile_scaling.py --nodes 1000 16000 --opt-level 2
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


def measure(n: int, size: int, opt_level: int) -> tuple[float, int, int, int]:
    """Seconds to compile a chain of n relus, the executable's bytes, its instructions and
    their dependencies."""
    graph = relu_chain(n, size)
    options = executable_pb2.CompileOptions(opt_level=opt_level)
    start = time.perf_counter()
    exe = compiler.compile(graph, "trn2", options)
    seconds = time.perf_counter() - start
    deps = sum(len(i.deps) for i in exe.instructions)
    return seconds, exe.ByteSize(), len(exe.instructions), deps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=[1000, 2000, 4000, 8000], help="chain lengths"
    )
    parser.add_argument("--size", type=int, default=4096, help="elements of each tensor")
    parser.add_argument("--opt-level", type=int, default=1, choices=(1, 2, 3))
    args = parser.parse_args()
    print(f"relu chain, {args.size} float32 elements a tensor, -O{args.opt_level}")
    print(f"{'nodes':>7} {'seconds':>8} {'MB':>8} {'instrs':>8} {'deps':>10} {'deps/node':>9}")
    for n in args.nodes:
        seconds, size, instrs, deps = measure(n, args.size, args.opt_level)
        print(
            f"{n:>7} {seconds:>8.2f} {size / 1e6:>8.2f} {instrs:>8} {deps:>10} {deps / n:>9.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
