"""The runtime's executables: loaded ones by cache key, compiled now or in the background,
fetched from a shared cache, and the compile wait they cost the simulated host."""

from __future__ import annotations

import atexit
import collections
import sys
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from trnsim.client.core import env, progress
from trnsim.client.core.compile_client import CompileClient, Compiled, CompileJob
from trnsim.client.core.errors import compile_error
from trnsim.client.core.metrics import Metrics
from trnsim.compiler import CompileError
from trnsim.compiler.graph import Graph, to_proto
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import executable_pb2, graph_pb2
from trnsim.simulator import execute
from trnsim.simulator.config import Target
from trnsim.simulator.device import Timeline

MAX_MISSES = 256


@dataclass(frozen=True)
class Miss:
    """A compile that missed every cache."""

    key: str
    graph: graph_pb2.Graph
    options: executable_pb2.CompileOptions
    name: str  # the op, or the kind of graph
    ops: int
    where: str  # the user's file:line of its first op

    @classmethod
    def of(cls, job: CompileJob) -> Miss:
        debug = job.debug if job.debug is not None else graph_pb2.GraphDebug()
        first = debug.node_locations[0] if debug.node_locations else None
        where = f"{first.file}:{first.line}" if first is not None else ""
        name = debug.name or "graph"
        return cls(job.key, job.graph, job.options, name, len(job.graph.nodes), where)


@dataclass(frozen=True)
class Asked:
    """A background compile this process asked for, and the simulated host time it asked
    at (its executable is usable once its compile time has passed since then)."""

    future: Future[Compiled]
    at_ns: int


class Executables:
    """The executables of one runtime. Each graph is compiled once per process (its key
    finds it again), at -O1 for eager ops and at -O2 for recorded graphs."""

    def __init__(
        self,
        compiler: CompileClient,
        target: Target,
        timeline: Timeline,
        metrics: Metrics,
        compile_clock: bool,
    ) -> None:
        self.compiler = compiler
        self.target = target
        self.timeline = timeline  # (the host waits on it for compiles)
        self.metrics = metrics
        self.compile_clock = compile_clock  # NEURON_SIM_COMPILE_CLOCK
        self.options = executable_pb2.CompileOptions()  # per-op executables: -O1
        self.fused_options = executable_pb2.CompileOptions(opt_level=2)  # recorded graphs
        self.loaded: dict[str, execute.LoadedExecutable] = {}
        self.misses: collections.deque[Miss] = collections.deque(maxlen=MAX_MISSES)
        # The fused graphs this process asked to compile, by key.
        self._asked: dict[str, Asked] = {}
        # Background compiles submitted and not finished (progress lines count them): a set,
        # as their callbacks run on the compile thread.
        self._background: set[Future[Compiled]] = set()
        # NEURON_RECORD_GRAPHS: every graph compiled or fetched, by cache key, for the
        # precompile manifest written at exit (trnsim precompile compiles it ahead).
        self.graph_log: dict[str, svc.CompileRequest] | None = None
        if env.record_graphs():
            self.graph_log = {}
            atexit.register(self._write_manifest)

    @property
    def shared(self) -> bool:
        """Whether compiles land in a cache other processes share (a daemon's)."""
        return self.compiler.shared

    def get(
        self, graph: Graph, debug: graph_pb2.GraphDebug, fused: bool = False
    ) -> execute.LoadedExecutable:
        """The loaded executable of a graph: from the in-process cache by key, else compiled
        now (at blocking priority: the op waits for it), per-op (-O1) or `fused` (-O2)."""
        job = self._job(graph, debug, fused)
        loaded = self.loaded.get(job.key)
        if loaded is not None:
            self.metrics.count("executable_cache_hits")
            return loaded
        compiled = self._compile_now(job, debug)
        self._log_graph(job)
        # A daemon's cache hit waited for no compile: fetched, compiled by an earlier run,
        # another process or `trnsim precompile`.
        fetched = compiled.fetched
        self.metrics.count("executables_fetched" if fetched else "executables_compiled")
        if not fetched:
            self._note_miss(job)
        self.wait_for_compile(compiled.waited_seconds)
        return self._keep(job.key, compiled)

    def _compile_now(self, job: CompileJob, debug: graph_pb2.GraphDebug) -> Compiled:
        """A blocking compile, announced if it lasts; the compiler's refusal names the op."""
        nodes, level = len(job.graph.nodes), f"-O{job.options.opt_level}"
        what = (
            f"{debug.name} ({level})"
            if nodes == 1
            else f"a {debug.name or ''} graph of {nodes} ops ({level})"
        )
        try:
            with progress.compile_wait(what, lambda: len(self._background)) as done:
                compiled = self.compiler.compile(job)
                done(compiled.executable.modelled_compile_seconds)
        except CompileError as e:
            raise compile_error(debug, e) from e
        return compiled

    def fetch(
        self, graph: Graph, debug: graph_pb2.GraphDebug, fused: bool = False
    ) -> execute.LoadedExecutable | None:
        """The loaded executable of a graph if this process or a shared cache already holds
        it; never compiles (adaptive mode asks for a graph it meets the first time: one that
        `trnsim precompile` or another process compiled runs fused at once)."""
        job = self._job(graph, debug, fused)
        loaded = self.loaded.get(job.key)
        if loaded is not None:
            return loaded
        if job.key in self._asked:  # (its own background compile: ready on the compile clock)
            return None
        compiled = self.compiler.cached(job.key) if self.compiler.shared else None
        if compiled is None:
            return None
        self._log_graph(job)
        self.metrics.count("executables_fetched")
        return self._keep(job.key, compiled)

    def prefetch(self, wanted: list[tuple[Graph, graph_pb2.GraphDebug, bool]]) -> int:
        """Loads the executables a shared cache holds of several graphs (graph, debug, fused)
        known at once, read in one go: then `get` finds them in process. For a caller that
        knows them before it runs them (a cut about to run op by op: its ops' deferred
        executables); what is not cached is compiled when `get` asks for it. Returns how many
        it loaded."""
        jobs: dict[str, CompileJob] = {}
        for graph, debug, fused in wanted:
            job = self._job(graph, debug, fused)
            if job.key not in self.loaded:
                jobs[job.key] = job
        if not jobs or not self.shared:
            return 0
        found = self.compiler.read(list(jobs))
        for key, compiled in found.items():
            self._log_graph(jobs[key])
            self.metrics.count("executables_fetched")
            self._keep(key, compiled)
        return len(found)

    def submit(self, graph: Graph, debug: graph_pb2.GraphDebug) -> Asked:
        """A compile at background priority and -O2 (adaptive mode's fused graphs): nothing
        waits for it; the future holds its answer, or the compile's error. A graph asked for
        again (another recorded graph with the same program) shares the first request: one
        compile, ready at one time on the simulated clock, whenever the real compile ends."""
        job = self._job(graph, debug, fused=True)
        asked = self._asked.get(job.key)
        if asked is not None:
            return asked
        future = self.compiler.compile_async(job)
        asked = self._asked[job.key] = Asked(future, int(self.timeline.host_ns))
        if self.graph_log is not None:  # (still compiling at exit: precompile finishes it)
            self._log_graph(job)
            log = self.graph_log

            def drop_if_refused(f: Future[Compiled]) -> None:
                if f.cancelled() or f.exception() is not None:  # not one to compile again
                    log.pop(job.key, None)

            future.add_done_callback(drop_if_refused)

        def note_if_compiled(f: Future[Compiled]) -> None:
            if not (f.cancelled() or f.exception() is not None or f.result().fetched):
                self._note_miss(job)

        future.add_done_callback(note_if_compiled)
        self._background.add(future)
        future.add_done_callback(self._background.discard)
        return asked

    def load(self, compiled: Compiled) -> execute.LoadedExecutable:
        """A compile's executable, parsed once into the steps that run it: the one place an
        executable is loaded."""
        return execute.load(compiled.executable)

    def _keep(self, key: str, compiled: Compiled) -> execute.LoadedExecutable:
        loaded = self.loaded[key] = self.load(compiled)
        return loaded

    def _job(self, graph: Graph, debug: graph_pb2.GraphDebug, fused: bool) -> CompileJob:
        options = self.fused_options if fused else self.options
        return CompileJob(to_proto(graph), self.target.name, options, debug)

    def _note_miss(self, job: CompileJob) -> None:
        """A compile that missed every cache (torch.neuron.explain() says what differed from
        the nearest cached key): the newest MAX_MISSES are kept."""
        self.misses.append(Miss.of(job))

    # -- the compile wait ---------------------------------------------------------------------
    def wait_for_compile(self, seconds: float) -> None:
        """The host waits for the modelled compile time it needs (NEURON_SIM_COMPILE_CLOCK)."""
        ns = self.compile_delay_ns(seconds)
        if ns:
            self.timeline.host_work(ns)
            self.metrics.count("compile_wait_ns", ns)

    def compile_delay_ns(self, seconds: float) -> int:
        """Simulated ns a compile that waited `seconds` (modelled) costs; 0 with the
        compile clock off (NEURON_SIM_COMPILE_CLOCK=off)."""
        return int(seconds * 1e9) if self.compile_clock and seconds > 0 else 0

    # -- the precompile manifest (NEURON_RECORD_GRAPHS) ---------------------------------------
    def _log_graph(self, job: CompileJob) -> None:
        if self.graph_log is not None and job.key not in self.graph_log:
            from trnsim.compiler import manifest

            self.graph_log[job.key] = manifest.request(
                job.graph, job.debug, job.target, job.options
            )

    def _write_manifest(self) -> None:
        from trnsim.compiler import manifest

        if not self.graph_log:
            return
        graphs = dict(self.graph_log)  # (a background compile may still add one)
        path = Path(env.record_graphs())
        n = manifest.merge_into(path, graphs)
        print(
            f"trnsim: {len(graphs)} graphs of this run in {path} ({n} in all); "
            f"compile them ahead with: trnsim precompile {path}",
            file=sys.stderr,
        )
        for key in graphs:
            self.graph_log.pop(key, None)
