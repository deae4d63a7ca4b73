"""When to ask for a graph's fused executable, and when to give up (adaptive eager mode).

A fused compile costs compile time once and saves launches and HBM round trips on every
later run. Ask on second sight, or at first sight when one run already pays for the
compile, or when a shared cache (the daemon) makes asking nearly free; never again after
a failure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompileCosts:
    base_ns: float = 30e6  # a compile's fixed cost (process hop, passes) [E, measured order]
    per_node_ns: float = 1e6  # and per node


@dataclass
class GraphHistory:
    seen: int = 0
    requested: bool = False
    ready: bool = False
    failed: bool = False


def predicted_compile_ns(nodes: int, costs: CompileCosts = CompileCosts()) -> float:
    return costs.base_ns + costs.per_node_ns * nodes


def predicted_saving_ns(ops: int, launch_ns: float, dispatch_ns: float, record_ns: float) -> float:
    """One fused run instead of `ops` separate ones: launches and host dispatches saved,
    recording paid. (HBM round trips saved come on top; they only add to the saving.)"""
    return max(0.0, (ops - 1) * launch_ns + ops * (dispatch_ns - record_ns))


def should_request(
    history: GraphHistory, saving_ns: float, compile_ns: float, shared_cache: bool
) -> bool:
    if history.failed or history.requested or history.ready:
        return False
    if history.seen >= 2:
        return True
    return shared_cache or saving_ns >= compile_ns
