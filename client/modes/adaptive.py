"""Adaptive eager mode (NEURON_EAGER=adaptive): ops are recorded into the buffer
(client/modes/tape.py) and cut into small graphs (policy/boundaries.py). A graph seen for the
first time runs op by op (per-op executables) while its fused executable compiles in the
background (policy/compile_policy.py); when the graph recurs and the executable is ready,
it runs fused, as one launch. Results equal eager mode bit for bit: both run the same ATen
ops on the CPU in the same order.
"""

from __future__ import annotations

from trnsim.client.core import runtime
from trnsim.client.core.notes import note_cut
from trnsim.client.modes.recording import GraphState, Recorder
from trnsim.client.modes.tape import Cut
from trnsim.policy import boundaries, compile_policy


class Adaptive(Recorder):
    """Adaptive mode's recorder: small graphs, each compiled in the background once it pays."""

    def __init__(self, rt: runtime.Runtime) -> None:
        super().__init__(rt, boundaries.Policy())

    def _recorded(self) -> None:
        rt = self.rt
        rt.host_work(rt.target.host_record_op_ns)
        rt.count("ops_recorded")

    def flush(self, reason: str) -> None:
        if not self.tape.steps:
            return
        cut = self.tape.take()
        rt = self.rt
        rt.count("graphs_formed")
        rt.count(f"cut_{reason}")
        note_cut(reason, cut.steps[-1].name)
        state = self._state(cut)
        self._collect(state)
        if state.history.seen == 1 and rt.executables.shared:
            self._fetch(state, cut)
        if self._run(state, cut):
            with rt.on_stream(cut.stream):
                self._maybe_request(state, cut)
        self._account(cut)

    # -- fused compiles -------------------------------------------------------------------------
    def _maybe_request(self, state: GraphState, cut: Cut) -> None:
        """Asks for the graph's fused compile, in the background, when the policy says it
        pays (policy/compile_policy.py)."""
        rt = self.rt
        n = cut.launches
        if n < 2 or state.fallback:
            return
        t = rt.target
        saving = compile_policy.predicted_saving_ns(
            n, t.launch_overhead_ns, t.host_dispatch_op_ns, t.host_record_op_ns
        )
        if not compile_policy.should_request(
            state.history,
            saving,
            compile_policy.predicted_compile_ns(len(cut.steps)),
            rt.executables.shared,
        ):
            return
        state.history.requested = True
        rt.count("fused_compiles_requested")
        graph, debug = cut.graph()
        asked = rt.executables.submit(graph, debug)
        state.future, state.submitted_ns = asked.future, asked.at_ns

    def _fetch(self, state: GraphState, cut: Cut) -> None:
        """A graph met the first time whose fused executable a shared cache already holds
        (`trnsim precompile`, another process, an earlier run) runs fused at once: no
        compile stands between it and its use."""
        if cut.launches < 2:
            return
        graph, debug = cut.graph()
        loaded = self.rt.executables.fetch(graph, debug, fused=True)
        if loaded is None:
            return
        state.loaded = loaded
        state.history.requested = state.history.ready = True
        self.rt.count("fused_graphs_fetched")

    def _collect(self, state: GraphState) -> None:
        """A background compile becomes the graph's executable (or a failure) once it has
        finished and, on the simulated clock, once the modelled compile time it waited for
        has passed since it was asked for (NEURON_SIM_COMPILE_CLOCK): until then the graph
        runs op by op, as on the chip while the compiler works."""
        future = state.future
        if future is not None and future.done():
            state.future = None
            try:
                compiled = future.result()
            except Exception:  # noqa: BLE001  (any failure: remember it, go on op by op)
                state.history.failed = True
                self.rt.count("fused_compiles_failed")
                return
            state.arrived = compiled
            state.ready_at_ns = state.submitted_ns + self.rt.executables.compile_delay_ns(
                compiled.waited_seconds
            )
        if state.arrived is None or self.rt.host_ns < state.ready_at_ns:
            return
        state.loaded, state.arrived = self.rt.executables.load(state.arrived), None
        state.history.ready = True
        self.rt.count("fused_compiles_ready")
