"""What the runtime notes for torch.neuron.explain() (client/api/explain.py) as it goes: where
recorded graphs were cut, which eager ops run in shape buckets, and in shape-only mode each
placeholder the host read and each data-dependent shape taken by assumption, at the user's
lines. The door and the modes write here; the report, above them, reads it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import TypedDict

from trnsim.client.core.errors import user_frame
from trnsim.simulator import shape_only

PLACEHOLDER = "zeros (False for a truth value)"


class Frame(TypedDict, total=False):
    """What compiled mode notes of code dynamo compiled: the user's line that called it last,
    and the nn.Module whose forward it runs ("Cls.forward at file:line")."""

    called_at: str
    module: str


class ShapeOnlyWarning(UserWarning):
    """A value the host read in shape-only mode (NEURON_SIM_NUMERICS=off): a placeholder."""


class Notes:
    """The process's notes (one instance, NOTES; explain.reset() clears them)."""

    def __init__(self) -> None:
        # (reason, last op, path, line, function) -> count
        self.cuts: Counter[tuple[str, str, str, int, str]] = Counter()
        # Shape-only mode: (kind, op, what, path, line) -> count; kind "placeholder" |
        # "assumed" | "computed".
        self.shape_only: Counter[tuple[str, str, str, str, int]] = Counter()
        self.warned: set[tuple[str, int]] = set()
        # Eager ops compiled per shape bucket (client/door/buckets.py): (op, path:line, the
        # bucket) -> signatures run in it; (op, path:line) -> its dynamic sizes; (op,
        # path:line, why) -> refusals.
        self.op_buckets: Counter[tuple[str, str, str]] = Counter()
        self.op_bucket_sizes: dict[tuple[str, str], str] = {}
        self.op_buckets_refused: Counter[tuple[str, str, str]] = Counter()
        self._quiet = 0  # explain() flushing for itself: not a cut of the user's
        # Compiled mode (client/modes/compiled.py): why graphs ran in the eager mode instead, each
        # shape bucket compiled or refused, each region traced on every call (not prepared as
        # one callable: client/modes/prepared.py), and per code object dynamo compiled the module it
        # ran for and the user's line that called it.
        self.eager_fallbacks: list[str] = []
        self.buckets: list[str] = []
        self.unprepared: list[str] = []
        self.warned_fallback = False  # the eager-fallback warning is said once a process
        self.frames: dict[object, Frame] = {}

    def reset(self) -> None:
        """What explain() reports of cuts, eager shape buckets and shape-only mode starts again
        (compiled mode's notes are the process's: its fallbacks, buckets and recompiled
        functions stay)."""
        self.cuts.clear()
        self.shape_only.clear()
        self.warned.clear()
        self.op_buckets.clear()
        self.op_bucket_sizes.clear()
        self.op_buckets_refused.clear()

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Cuts inside the block are not noted."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def cut(self, reason: str, last_op: str) -> None:
        """A recorded graph was cut here (adaptive mode)."""
        if self._quiet:
            return
        path, line, function = user_frame()
        self.cuts[(reason, last_op, path, line, function)] += 1

    def placeholder(self, what: str) -> None:
        """The host read a value the device never computed (shape-only mode): it got
        PLACEHOLDER. Warned once per source line, named by it."""
        path, line, _ = user_frame()
        self.shape_only[("placeholder", what, PLACEHOLDER, path, line)] += 1
        if (path, line) in self.warned:
            return
        self.warned.add((path, line))
        warnings.warn_explicit(
            f"NEURON_SIM_NUMERICS=off: {what} read a value the simulated device never "
            f"computed; it is a placeholder, {PLACEHOLDER}. Control flow and sizes that depend "
            "on it follow the placeholder (torch.neuron.explain() lists every such line).",
            ShapeOnlyWarning,
            filename=path,
            lineno=line,
        )

    def assumption(self, op: str, text: str, kind: str = "assumed") -> None:
        """A data-dependent output shape taken by assumption (shape-only mode), at the line
        that issued the op (a recorded graph's op runs later, at another line). kind
        "computed": an op computed for real, its sizes unknown otherwise."""
        where = shape_only.issued.where
        if where:
            path, _, line = where.rpartition(":")
            self.shape_only[(kind, op, text, path, int(line))] += 1
            return
        path, n, _ = user_frame()
        self.shape_only[(kind, op, text, path, n)] += 1

    def computed(self, op: str, text: str) -> None:
        self.assumption(op, text, "computed")


NOTES = Notes()
note_cut = NOTES.cut
note_placeholder = NOTES.placeholder
reset = NOTES.reset

# Shape-only mode tells the notes of each placeholder and assumption.
shape_only.hooks.placeholder = NOTES.placeholder  # type: ignore[method-assign]
shape_only.hooks.assumed = NOTES.assumption  # type: ignore[method-assign]
shape_only.hooks.computed = NOTES.computed  # type: ignore[method-assign]
