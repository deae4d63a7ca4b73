"""`trnsim explain`, `trnsim registry` and `trnsim record`: the commands that run the client,
and so PyTorch. The client is imported only when one of them runs (importing torch takes
seconds the other commands never pay); each parses its own arguments (client/api/explain.py,
client/api/registry.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

COMMANDS = ("registry", "record", "explain")
# Files a run writes at its exit (the client's variables): never for a command of ours.
RUN_OUTPUTS = ("NEURON_EXPLAIN", "NEURON_PROFILE", "NEURON_RECORD_GRAPHS", "NEURON_RECORD_SHAPES")


@contextlib.contextmanager
def _without_run_outputs() -> Iterator[None]:
    """What a run writes at exit must not be rewritten by these commands: the client reads
    these variables when torch loads it and when its runtime starts, both within."""
    kept = {k: os.environ.pop(k) for k in RUN_OUTPUTS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(kept)


def run(argv: list[str]) -> int:
    """argv: the command's name, then its arguments."""
    if argv[0] == "record":  # the command it runs gets the user's environment whole
        from trnsim.client.api import registry

        return registry.main(argv)
    with _without_run_outputs():
        if argv[0] == "explain":
            from trnsim.client.api import explain

            return explain.main(argv[1:])
        from trnsim.client.api import registry

        return registry.main(argv[1:])
