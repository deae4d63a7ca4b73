"""A compile that missed every cache says what differed: the daemon answers which key it
cached before the miss is nearest to it (Nearest), and torch.neuron.explain() lists the
parts that differ."""

from __future__ import annotations

import os

from .helpers import run_json

RUN = """
import json, sys, torch
n = int(sys.argv[1])
x = torch.randn(4, n).to("neuron")
(x * 3).relu()
torch.neuron.synchronize()
print(json.dumps(torch.neuron.explain().misses))
"""


def _misses(address: str, n: int) -> list[dict[str, object]]:
    env = {**os.environ, "NEURON_COMPILE_DAEMON": address, "NEURON_EAGER": "eager"}
    return run_json(RUN, env, str(n))  # type: ignore[no-any-return]


def test_a_miss_names_the_part_that_differs_from_the_nearest_cached_key(daemon):
    first = _misses(daemon.address, 8)
    assert first and all(m["against"] == "the daemon's cache" for m in first)
    second = {m["name"]: m for m in _misses(daemon.address, 12)}  # other shapes, same ops
    relu = second["aten::relu.default"]
    assert relu["nearest"] and relu["nearest"] != relu["key"]
    (differs,) = relu["differs"]
    assert differs.startswith("shapes: in [4, 12]") and "(nearest cached: in [4, 8]" in differs
