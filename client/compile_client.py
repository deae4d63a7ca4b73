"""How the runtime gets executables: one interface, transports behind it (in process first)."""

from __future__ import annotations

from typing import Protocol

from trnsim import compiler
from trnsim.protos import executable_pb2, graph_pb2


class CompileClient(Protocol):
    def compile(
        self,
        graph: graph_pb2.Graph,
        target: str,
        options: executable_pb2.CompileOptions,
        debug: graph_pb2.GraphDebug | None,
    ) -> executable_pb2.Executable: ...


class InProcessCompileClient:
    """Compiles in this process: the baseline, and the fallback when no daemon answers."""

    def __init__(self) -> None:
        self.compiles = 0

    def compile(
        self,
        graph: graph_pb2.Graph,
        target: str,
        options: executable_pb2.CompileOptions,
        debug: graph_pb2.GraphDebug | None,
    ) -> executable_pb2.Executable:
        self.compiles += 1
        return compiler.compile(graph, target, options, debug)


def make_client() -> CompileClient:
    return InProcessCompileClient()
