"""Tests never touch the user's daemon or cache: in-process compiles unless a test starts
its own daemon, and a throwaway cache directory. Compile times are modelled, not burnt."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("NEURON_COMPILE_DAEMON", "off")
os.environ.setdefault("NEURON_CACHE_DIR", tempfile.mkdtemp(prefix="trnsim-test-cache-"))
# Compiles cost no CPU here (the wall-time burn is for benchmarks and users) and stay off the
# simulated clock, so fused graphs are usable as soon as compiled; tests of those clocks
# turn them on themselves.
os.environ.setdefault("NEURON_SIM_COMPILE_SCALE", "0")
os.environ.setdefault("NEURON_SIM_COMPILE_CLOCK", "off")


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """The op tests generated from the shape registry run first: fast, and an op-level
    failure shows there before a model built on the op fails."""
    items.sort(key=lambda item: "tests/registry/" not in str(item.fspath))
