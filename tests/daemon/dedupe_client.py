"""One client process of the dedupe test: asks for N graphs at once, prints each digest."""

from __future__ import annotations

import hashlib
import sys

from trnsim.client.core.compile_client import DaemonCompileClient

from tests.daemon.helpers import request

address, count, sleep_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = DaemonCompileClient(address, auto_start=False)
futures = [client.submit(request(i, debug_sleep_ms=sleep_ms)) for i in range(count)]
for i, f in enumerate(futures):
    result = f.result(timeout=120)
    assert result.WhichOneof("outcome") == "executable", result.error.message
    print(i, hashlib.sha256(result.executable.data).hexdigest(), flush=True)
