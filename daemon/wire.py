"""The CompileService's methods on the server, with requests decoded here, not by gRPC: a
message that does not decode gets INVALID_ARGUMENT on a unary call, and an error answer
(INVALID_REQUEST, id 0) on the Compile stream, which stays open. (gRPC's own decoding
answers UNKNOWN, or ends a stream with OK and no answer.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from trnsim.protos import compile_service_pb2 as svc

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
