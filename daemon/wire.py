"""The CompileService's methods on the server, with requests decoded here, not by gRPC: a
message that does not decode gets INVALID_ARGUMENT on a unary call, and an error answer
(INVALID_REQUEST, id 0) on the Compile stream, which stays open. (gRPC's own decoding
answers UNKNOWN, or ends a stream with OK and no answer.) request_problem() refuses what
decodes but must not be compiled: unknown operators, wrong arguments, out-of-bounds sizes."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import graph_pb2
from trnsim.simulator import dtypes

log = logging.getLogger(__name__)
SERVICE = "trnsim.service.CompileService"


class Undecodable:
    """A Compile stream message that was not a CompileRequest; request_id is its id field
    when the top level of the message still gives it (else 0)."""

    def __init__(self, error: Exception, request_id: int) -> None:
        self.error = error
        self.request_id = request_id


async def decoded_stream(
    raw: AsyncIterator[bytes],
) -> AsyncIterator[svc.CompileRequest | Undecodable]:
    async for data in raw:
        try:
            yield svc.CompileRequest.FromString(data)
        except (DecodeError, RecursionError, ValueError) as e:
            yield Undecodable(e, peek_id(data))


def peek_id(data: bytes) -> int:
    """Field 1 (id) of a message read at its top level only, skipping every other field
    unread: a request nested too deep to decode still gets its answer under its own id."""
    pos = 0
    try:
        while pos < len(data):
            key, pos = _varint(data, pos)
            field, kind = key >> 3, key & 7
            if kind == 0:
                value, pos = _varint(data, pos)
                if field == 1:
                    return value
            elif kind == 2:
                size, pos = _varint(data, pos)
                pos += size
            elif kind in (1, 5):
                pos += 8 if kind == 1 else 4
            else:
                return 0
    except IndexError:
        pass
    return 0


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80 or shift > 63:
            return value, pos
        shift += 7


def _unary(
    kind: type[Message], method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Message]]
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Message]]:
    async def handler(data: bytes, context: grpc.aio.ServicerContext) -> Message:
        try:
            request = kind.FromString(data)
        except (DecodeError, RecursionError, ValueError) as e:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"not a {kind.__name__} message: {e}"
            )
        return await method(request, context)

    return handler


UNARY = {
    "Lookup": (svc.LookupRequest, svc.LookupResponse),
    "Touch": (svc.TouchRequest, svc.TouchResponse),
    "Stats": (svc.StatsRequest, svc.StatsResponse),
    "GetInfo": (svc.GetInfoRequest, svc.GetInfoResponse),
    "Nearest": (svc.NearestRequest, svc.NearestResponse),
}


def register(server: grpc.aio.Server, service: Any) -> None:
    """Adds the service's methods to the server (Compile takes decoded_stream's items)."""

    async def compile_stream(
        raw: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[svc.CompileResult]:
        async for result in service.Compile(decoded_stream(raw), context):
            yield result

    handlers = {
        "Compile": grpc.stream_stream_rpc_method_handler(
            compile_stream, response_serializer=svc.CompileResult.SerializeToString
        )
    }
    for name, (request, response) in UNARY.items():
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            _unary(request, getattr(service, name)),
            response_serializer=response.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


# -- what a request may ask: torch's operators, their arguments, bounds --------------------------
SCHEMAS = Path(__file__).with_name("op_schemas.txt")  # tests/daemon/op_schemas.py writes it
# Declared scalars a graph may take: each is a float its executable reads at every run; a
# million is far beyond a 100,000-node graph's (a count of 2**32-1 was once compiled).
MAX_SCALAR_INPUTS = 1 << 20
MAX_BYTES = (1 << 63) - 1  # a tensor's offset plus extent, in bytes, must fit in int64


@dataclass(frozen=True)
class Schema:
    """An operator's arguments, as torch registers them."""

    names: tuple[str, ...]
    required: frozenset[str]  # those without a default
    varargs: bool


@dataclass(frozen=True)
class Registry:
    """The operators of the torch daemon/op_schemas.txt was made from, by "ns::op.overload"."""

    torch_version: str
    ops: dict[str, Schema]
    namespaces: frozenset[str]


@functools.cache
def registry() -> Registry | None:
    """The operator registry, or None (op names then checked for form only) when the torch
    installed beside the daemon is not the one it was made from: a newer torch's ops must
    not be refused by an old list. (Read from a file: the daemon never imports torch.)"""
    lines = SCHEMAS.read_text().splitlines()
    made_from = lines[0].removeprefix("# torch ").strip()
    try:
        installed = metadata.version("torch")
    except metadata.PackageNotFoundError:
        installed = "none"
    if installed != made_from:
        log.warning(
            "op names are checked for form only: %s lists torch %s's operators, torch %s is "
            "installed (python tests/daemon/op_schemas.py rewrites it)",
            SCHEMAS.name,
            made_from,
            installed,
        )
        return None
    ops: dict[str, Schema] = {}
    for line in lines[1:]:
        name, *args = line.split("\t")
        varargs = args[-1:] == ["*"]
        names = tuple(a.removesuffix("=") for a in args if a != "*")
        required = frozenset(a for a in args if a != "*" and not a.endswith("="))
        ops[name] = Schema(names, required, varargs)
    return Registry(made_from, ops, frozenset(n.split("::", 1)[0] for n in ops))


def request_problem(request: svc.CompileRequest) -> svc.CompileError | None:
    """What is wrong with a well-formed graph (compiler/graph.py validated its form) that the
    daemon must not compile and cache: an operator torch does not have, arguments its
    schema does not take, a scalar count beyond any graph, a tensor whose bytes do not fit
    in int64. None if nothing; else the error, its message naming the node (or input) and
    the fault. An operator the list lacks is UNKNOWN_OP, not INVALID_REQUEST: the list is
    what torch registered when it was written, and an op registered later (a library the
    user imports, a custom op without a declared cost) is real in the client's process,
    which compiles the graph itself. (A tensor larger than the device's memory is a real
    graph too, answered OUT_OF_DEVICE_MEMORY by the compiler: the user's out-of-memory
    error.)"""
    graph = request.graph
    if graph.num_scalar_inputs > MAX_SCALAR_INPUTS:
        return _invalid(
            f"{graph.num_scalar_inputs} scalar inputs, over the limit of {MAX_SCALAR_INPUTS}"
        )
    for k, t in enumerate(graph.inputs):
        problem = _extent_problem(t)
        if problem:
            return _invalid(f"input {k}: {problem}")
    table = registry()
    for i, node in enumerate(graph.nodes):
        schema, unknown = _schema(node, table)
        if unknown:
            return svc.CompileError(
                error_class=svc.UNKNOWN_OP,
                message=f"node {i} ({node.op[:200]}): {unknown}; compiled in the client's process",
            )
        problem = _argument_problem(node, schema) if schema is not None else None
        if problem:
            return _invalid(f"node {i} ({node.op}): {problem}")
        for j, t in enumerate(node.outputs):
            problem = _extent_problem(t)
            if problem:
                return _invalid(f"node {i} ({node.op}) output {j}: {problem}")
    return None


def _invalid(message: str) -> svc.CompileError:
    return svc.CompileError(error_class=svc.INVALID_REQUEST, message=f"malformed graph: {message}")


def _schema(node: graph_pb2.Node, table: Registry | None) -> tuple[Schema | None, str]:
    """The op's schema when the list has it, and why the op is unknown ("" when it is not):
    an op outside torch's namespaces must be a custom kernel (a declared cost); one of
    torch's must be in the list."""
    if table is None:
        return None, ""
    namespace, _, rest = node.op.partition("::")
    name, _, overload = rest.partition(".")
    if namespace not in table.namespaces:
        if node.HasField("cost"):
            return None, ""
        return None, (
            "neither an operator of torch nor a custom kernel with a declared cost "
            "(torch.neuron.register_kernel)"
        )
    schema = table.ops.get(f"{namespace}::{name}.{overload or 'default'}")
    if schema is None:
        return None, f"torch {table.torch_version} has no such operator"
    return schema, ""


def _argument_problem(node: graph_pb2.Node, schema: Schema) -> str | None:
    """Arguments the op's schema does not take, or a required one missing."""
    if not schema.varargs and len(node.args) > len(schema.names):
        return f"{len(node.args)} arguments, its schema takes {len(schema.names)}"
    given: set[str] = set()
    for k, arg in enumerate(node.args):
        if not arg.name or (arg.name not in schema.names and _POSITIONAL.fullmatch(arg.name)):
            given.add(schema.names[k] if k < len(schema.names) else "*")  # (by position)
        elif arg.name in schema.names or schema.varargs:
            given.add(arg.name)
        else:
            return f"no argument {arg.name[:80]!r} (it takes {', '.join(schema.names)})"
    missing = [n for n in schema.names if n in schema.required and n not in given]
    if missing:
        return f"missing argument {missing[0]!r} (it takes {', '.join(schema.names)})"
    return None


# Arguments are named by the schema, or unnamed (graphs built by hand, JSON) or "arg<k>"
# (past the schema's positional names, client/core/ops.py): those count by position.
_POSITIONAL = re.compile(r"arg\d+")


def _extent_problem(t: graph_pb2.TensorType, limit: int = MAX_BYTES) -> str | None:
    """A tensor whose storage offset plus extent, in bytes, is over `limit`."""
    if any(s < 0 for s in t.shape):
        return None  # (a data-dependent output: sized when it has run)
    span = 0 if any(s == 0 for s in t.shape) else 1
    if span:
        span += sum((s - 1) * st for s, st in zip(t.shape, t.strides, strict=False))
    end = (t.storage_offset + span) * dtypes.itemsize(t.dtype)
    if end > limit:
        return (
            f"storage offset {t.storage_offset} plus extent {span} elements end at byte "
            f"{end}, beyond int64"
        )
    return None
