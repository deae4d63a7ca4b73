"""Op tests generated from the shape registry recorded from the model zoo (zoo.jsonl, checked
in): every signature the zoo's 37 models and the GPT example dispatched, with random inputs of
exactly that geometry, neuron against CPU, in eager and adaptive mode. They run first in
`make test` (tests/conftest.py): an op-level failure shows here before any model fails.

Record it again with: NEURON_RECORD_SHAPES=$PWD/tests/registry/zoo.jsonl make zoo
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from trnsim.client.api import registry
from trnsim.client.core.shapes import Signature, load

REGISTRY = Path(__file__).with_name("zoo.jsonl")


def _by_op() -> dict[str, list[Signature]]:
    ops: dict[str, list[Signature]] = defaultdict(list)
    for sig in load(REGISTRY):
        ops[sig.op].append(sig)
    return dict(sorted(ops.items()))


OPS = _by_op()


def test_the_registry_covers_the_zoo():
    sources = {src for sigs in OPS.values() for s in sigs for src in s.sources}
    assert len(sources) >= 30 and sum(len(s) for s in OPS.values()) >= 1000


@pytest.mark.parametrize("op", list(OPS))
def test_every_recorded_signature_of_the_op(op):
    results = registry.run_all(OPS[op], ["eager", "adaptive"])
    failed = [
        f"[{mode}] {o.reason}" for mode, rs in results.items() for o in rs if o.status == "fail"
    ]
    assert not failed, failed
    assert any(o.status == "pass" for o in results["eager"]), "at least one signature ran"
