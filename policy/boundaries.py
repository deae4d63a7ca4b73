"""Where a recorded buffer of ops is cut into a graph (adaptive eager mode).

Pure policy: given what the next op is, what is buffered and how deep the device queue
is, say whether to keep recording or cut first. Cut reasons are counted by the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Cut(Enum):
    NONE = "none"  # keep recording
    SYNC = "sync"  # the host needs results (item, cpu, print, synchronize)
    DYNAMIC_SHAPE = "dynamic_shape"  # output shape depends on data: run it now
    FIRST_SIGHT = "first_sight"  # an op signature never run: run it now, check its outputs
    NOT_FUSIBLE = "not_fusible"  # the compiler cannot put it in a graph: run it now
    STREAM_CHANGE = "stream_change"
    SIZE_CAP = "size_cap"
    HAZARD = "hazard"  # recording past it could reorder memory effects
    QUEUE_DRAINED = "queue_drained"  # the device ran dry while a long buffer grew

    @property
    def runs_op_eagerly(self) -> bool:
        """True: after the cut the op itself runs on its own, not recorded."""
        return self in (Cut.DYNAMIC_SHAPE, Cut.NOT_FUSIBLE, Cut.FIRST_SIGHT)


@dataclass(frozen=True)
class Policy:
    size_cap: int = 1024  # ops per graph at most (TorchNeuron's cap)
    low_water: int = 1  # queue depth under which the device is about to idle
    drain_min_ops: int = 256  # a drained queue cuts only buffers at least this long


@dataclass(frozen=True)
class NextOp:
    fusible: bool
    dynamic: bool
    stream: int
    hazard: bool = False
    # The op's outputs were seen to match the metadata recording hands out (shapes from
    # Meta kernels, which disagree with the CPU's for a few ops: batch norm in eval...).
    verified: bool = True


def decide(
    buffered: int, buffer_stream: int, op: NextOp, queue_depth: int, policy: Policy = Policy()
) -> Cut:
    """What to do before recording `op` behind `buffered` ops recorded on buffer_stream.

    Boundaries depend on the op stream (and only on a long buffer meeting a drained
    queue), so the same program cuts the same graphs every step and they recur.
    """
    if op.dynamic:
        return Cut.DYNAMIC_SHAPE
    if not op.fusible:
        return Cut.NOT_FUSIBLE
    if not op.verified:
        return Cut.FIRST_SIGHT
    if buffered == 0:
        return Cut.NONE
    if op.stream != buffer_stream:
        return Cut.STREAM_CHANGE
    if op.hazard:
        return Cut.HAZARD
    if buffered >= policy.size_cap:
        return Cut.SIZE_CAP
    if buffered >= policy.drain_min_ops and queue_depth < policy.low_water:
        return Cut.QUEUE_DRAINED
    return Cut.NONE
