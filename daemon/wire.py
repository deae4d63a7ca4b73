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
    """A Compile stream message that was not a CompileRequest."""

    def __init__(self, error: Exception) -> None:
        self.error = error


async def decoded_stream(
    raw: AsyncIterator[bytes],
) -> AsyncIterator[svc.CompileRequest | Undecodable]:
    async for data in raw:
        try:
            yield svc.CompileRequest.FromString(data)
        except (DecodeError, RecursionError, ValueError) as e:
            yield Undecodable(e)


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
