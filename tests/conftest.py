"""Tests never touch the user's daemon or cache: in-process compiles unless a test starts
its own daemon, and a throwaway cache directory."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("NEURON_COMPILE_DAEMON", "off")
os.environ.setdefault("NEURON_CACHE_DIR", tempfile.mkdtemp(prefix="trnsim-test-cache-"))


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """The op tests generated from the shape registry run first: fast, and an op-level
    failure shows there before a model built on the op fails."""
    items.sort(key=lambda item: "tests/registry/" not in str(item.fspath))
