"""python -m trnsim.cli: the `trnsim` command."""

from __future__ import annotations

import sys

from trnsim.cli import main

if __name__ == "__main__":
    sys.exit(main())
