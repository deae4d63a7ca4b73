"""Op tests from the shape registry the transformers sweep recorded (sweep.jsonl.gz, checked
in; `make sweep` records it again and tests it whole): a sample stratified by op, at most
PER_OP signatures of each, spread over its shapes, neuron against CPU in eager and adaptive
mode. They run first in `make test` with the zoo's registry (tests/conftest.py).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from trnsim.client.api import registry
from trnsim.client.core.shapes import Signature, load

REGISTRY = Path(__file__).with_name("sweep.jsonl.gz")
PER_OP = 2
ALL = load(REGISTRY)


def _sample_by_op() -> dict[str, list[Signature]]:
    ops: dict[str, list[Signature]] = defaultdict(list)
    for sig in registry.stratified(ALL, PER_OP):
        ops[sig.op].append(sig)
    return dict(sorted(ops.items()))


SAMPLE = _sample_by_op()


def test_the_registry_is_the_sweeps() -> None:
    sources = {src for s in ALL for src in s.sources}
    assert len(sources) >= 100 and len(ALL) >= 10_000, (len(sources), len(ALL))
    assert all(len(sigs) <= PER_OP for sigs in SAMPLE.values())


@pytest.mark.parametrize("op", list(SAMPLE))
def test_a_stratified_sample_of_the_op(op: str) -> None:
    results = registry.run_all(SAMPLE[op], ["eager", "adaptive"])
    failed = [
        f"[{mode}] {o.reason}" for mode, rs in results.items() for o in rs if o.status == "fail"
    ]
    assert not failed, failed
