"""Versions every executable and cache key carries."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

FORMAT_VERSION = 1  # protos/executable.proto layout; bump on incompatible changes
RELEASE = "0.1.0"

_PRICED_BY = ("config.py", "cost_model.py", "dtypes.py")  # simulator modules the compiler reads


@cache
def compiler_version() -> str:
    """Release plus a digest of the compiler's own sources and the cost tables it uses.

    Any change to how executables are built changes the version, so no cache ever hands
    out an executable built by different code.
    """
    here = Path(__file__).resolve().parent
    simulator = here.parent / "simulator"
    files = sorted(here.glob("*.py")) + [simulator / name for name in _PRICED_BY]
    digest = hashlib.sha256()
    for path in files:
        if path.exists():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"{RELEASE}+{digest.hexdigest()[:12]}"
