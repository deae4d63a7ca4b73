"""A compile worker process: reads CompileRequests on stdin, writes CompileResults on stdout.

Messages are length-prefixed protobuf (4 bytes big-endian, then the message): nothing
that crosses the process boundary is pickled. Started by workers.WorkerPool.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from typing import BinaryIO

from trnsim import compiler
from trnsim.compiler.compile_time import burn
from trnsim.daemon.config import compile_scale
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos.blobs import make_blob

_HEADER = struct.Struct(">I")


def read_message(stream: BinaryIO) -> bytes | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    return data if len(data) == size else None


def write_message(stream: BinaryIO, data: bytes) -> None:
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def compile_request(request: svc.CompileRequest, scale: float = 0.0) -> svc.CompileResult:
    """Compiles one request; compiler errors become DETERMINISTIC (OUT_OF_DEVICE_MEMORY for
    a graph the target cannot hold), the worker's own resource errors TRANSIENT. The worker
    then stays busy for scale x the modelled compile time (NEURON_SIM_COMPILE_SCALE)."""
    options = request.options
    if options.debug_crash_worker:
        os._exit(70)  # debug-only: a worker dying mid-compile, as an OOM kill would
    if options.debug_sleep_ms:
        time.sleep(options.debug_sleep_ms / 1000)
    start = time.perf_counter()
    result = svc.CompileResult(id=request.id)
    try:
        exe = compiler.compile(request.graph, request.target, options, request.debug)
    except compiler.GraphTooLargeError as e:
        result.error.CopyFrom(
            svc.CompileError(error_class=svc.OUT_OF_DEVICE_MEMORY, message=str(e))
        )
        return result
    except (MemoryError, OSError) as e:
        result.error.CopyFrom(
            svc.CompileError(error_class=svc.TRANSIENT, message=f"{type(e).__name__}: {e}")
        )
        return result
    except Exception as e:  # noqa: BLE001  (the same graph fails the same way: deterministic)
        result.error.CopyFrom(
            svc.CompileError(error_class=svc.DETERMINISTIC, message=f"{type(e).__name__}: {e}")
        )
        return result
    burn(exe.modelled_compile_seconds * scale, background=request.priority == svc.BACKGROUND)
    seconds = time.perf_counter() - start
    blob = make_blob(exe.SerializeToString(), exe.format_version, exe.cache_key)
    blob.compile_seconds = seconds
    result.executable.CopyFrom(blob)
    result.cache_key = exe.cache_key
    result.compile_seconds = seconds
    result.modelled_compile_seconds = exe.modelled_compile_seconds
    return result


def main() -> None:
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # nothing but messages on the pipe
    scale = compile_scale()
    while True:
        data = read_message(inp)
        if data is None:
            return
        request = svc.CompileRequest.FromString(data)
        write_message(out, compile_request(request, scale).SerializeToString())


if __name__ == "__main__":
    main()
