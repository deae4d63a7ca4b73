"""python -m trnsim.daemon: the same as `trnsim daemon serve` (how a client starts one).
Exit status 2: a configuration it cannot use; 75 (EXIT_PATH_HELD): another daemon holds
the socket's path, which the launcher takes for "a daemon is there"."""

from __future__ import annotations

import argparse
import sys

from trnsim.daemon import options
from trnsim.daemon.config import ConfigError
from trnsim.daemon.pathlock import EXIT_PATH_HELD, PathHeld
from trnsim.daemon.server import serve_in_foreground


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trnsim daemon serve")
    options.add_server_options(p)
    args = p.parse_args(argv)
    try:
        return serve_in_foreground(options.config_from(args))
    except PathHeld as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_PATH_HELD
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
