"""The sweep's modules import each other, and the zoo's, as scripts do (`from shrink import ...`)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (str(HERE), str(HERE.parent / "zoo")):
    if path not in sys.path:
        sys.path.insert(0, path)
