"""A server that poses as the compile daemon (another local user's, in the tests): answers
GetInfo as a compatible daemon would, and writes down every Compile request it receives.

    python tests/daemon/fake_server.py ADDRESS LOG [--mute] [--slow-info]

--mute: it takes the Compile stream and never answers (a hung daemon).
--slow-info: GetInfo answers after 3 s (a daemon loaded by many processes starting at once)."""

from __future__ import annotations

import sys
import time
from concurrent import futures

import grpc
from trnsim import compiler
from trnsim.protos import compile_service_pb2 as svc


def main(address: str, log: str, mute: bool, slow_info: bool) -> None:
    def get_info(request: svc.GetInfoRequest, context: grpc.ServicerContext) -> svc.GetInfoResponse:
        if slow_info:
            time.sleep(3)
        return svc.GetInfoResponse(
            compiler_version=compiler.compiler_version(),
            format_version=compiler.FORMAT_VERSION,
            compatible=True,
        )

    def compile_stream(requests, context):  # type: ignore[no-untyped-def]
        for r in requests:
            with open(log, "a") as f:
                f.write(f"received graph of {len(r.graph.nodes)} nodes\n")
            if not mute:
                yield svc.CompileResult(id=r.id)
        time.sleep(3600)

    handlers = {
        "GetInfo": grpc.unary_unary_rpc_method_handler(
            get_info,
            request_deserializer=svc.GetInfoRequest.FromString,
            response_serializer=svc.GetInfoResponse.SerializeToString,
        ),
        "Compile": grpc.stream_stream_rpc_method_handler(
            compile_stream,
            request_deserializer=svc.CompileRequest.FromString,
            response_serializer=svc.CompileResult.SerializeToString,
        ),
    }
    server = grpc.server(futures.ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("trnsim.service.CompileService", handlers),)
    )
    server.add_insecure_port(address)
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--mute" in sys.argv[3:], "--slow-info" in sys.argv[3:])
