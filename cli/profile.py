"""`trnsim profile FILE`: the table of a profile NEURON_PROFILE or torch.neuron.profile wrote."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trnsim.simulator import trace


def cmd_profile(args: argparse.Namespace) -> int:
    """Device time by op, by source line and by engine, from a profile's trace."""
    try:
        events = trace.read(Path(args.file))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(trace.summary(events, args.top))
    return 0
