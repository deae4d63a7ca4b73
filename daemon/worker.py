"""A compile worker process: reads CompileRequests on stdin, writes CompileResults on stdout.

Messages are length-prefixed protobuf (4 bytes big-endian, then the message): nothing
that crosses the process boundary is pickled. Started by workers.WorkerPool as
`python -m trnsim.daemon.worker --parent <daemon pid>`; it never outlives that daemon.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import struct
import sys
import threading
import time
from typing import BinaryIO

from trnsim import compiler
from trnsim.compiler.compile_time import burn
from trnsim.daemon.config import compile_scale
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos.blobs import make_blob

_HEADER = struct.Struct(">I")
PARENT_OPTION = "--parent"  # the daemon's pid, on the command line (workers.reap_orphans reads it)
_PR_SET_PDEATHSIG = 1  # prctl(2)
WATCH_PARENT_S = 0.5


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


def die_with(parent: int) -> None:
    """Ends this process when its daemon (pid `parent`) dies, however it dies: a compile
    finished for nobody only holds a CPU. On Linux the kernel kills it (PR_SET_PDEATHSIG,
    even mid-compile); everywhere a thread checks the parent twice a second; and a worker
    waiting for work sees its stdin close. A parent already gone before the signal was set
    (the daemon died while this process started) ends it at once."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
    threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:  # (an orphan is adopted by init or a subreaper)
        time.sleep(WATCH_PARENT_S)
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m trnsim.daemon.worker")
    p.add_argument(PARENT_OPTION, type=int, help="the daemon's pid: exit when it is gone")
    args = p.parse_args(argv)
    if args.parent is not None:
        die_with(args.parent)
    # A terminal's Ctrl-C reaches the whole process group: the daemon drains (its running
    # compiles finish) and then stops its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
