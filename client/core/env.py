"""Every environment variable the client reads, with its default and meaning (listed in the
README), read here and nowhere else in client/. The daemon's own (NEURON_CACHE_DIR,
XDG_RUNTIME_DIR, XDG_CACHE_HOME, TRNSIM_ALLOW_TCP, and systemd's CACHE_DIRECTORY and
NOTIFY_SOCKET) are read in daemon/config.py: the daemon imports nothing of the client."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from trnsim.compiler.compile_time import parse_scale

NEURON_SIM_TARGET = "NEURON_SIM_TARGET"  # trn1 | trn2 (default trn2): the simulated chip
NEURON_EAGER = "NEURON_EAGER"  # eager (default) | adaptive
NEURON_COMPILE_DAEMON = "NEURON_COMPILE_DAEMON"  # auto | off | an address (issue: daemon)
NEURON_COMPILE_DEADLINE = "NEURON_COMPILE_DEADLINE"  # s a compile waits for the daemon (660)
NEURON_COMPILE_HEALTH_DEADLINE = "NEURON_COMPILE_HEALTH_DEADLINE"  # s to show it is alive (1)
NEURON_COMPILE_DIRECT_READS = "NEURON_COMPILE_DIRECT_READS"  # 1 (default) | 0: hits read from disk
NEURON_FAST_DOOR = "NEURON_FAST_DOOR"  # on (default) | off: the C++ door (client/door/fast.py)
NEURON_RT_VISIBLE_CORES = "NEURON_RT_VISIBLE_CORES"  # core(s) this process drives: "3" or "2-3"
NEURON_PROFILE = "NEURON_PROFILE"  # a file: the process's profile, written at exit
NEURON_SIM_HOST = "NEURON_SIM_HOST"  # modelled (default) | measured: host costs on the timeline
NEURON_SIM_COMPILE_SCALE = "NEURON_SIM_COMPILE_SCALE"  # CPU s burnt per modelled compile s
NEURON_SIM_COMPILE_CLOCK = "NEURON_SIM_COMPILE_CLOCK"  # on (default) | off: compiles on the clock
NEURON_SIM_NUMERICS = "NEURON_SIM_NUMERICS"  # on (default) | off: shape-only, no values computed
NEURON_RECORD_SHAPES = (
    "NEURON_RECORD_SHAPES"  # a file: record op signatures (client/api/registry.py)
)
NEURON_RECORD_SOURCE = "NEURON_RECORD_SOURCE"  # the model name recorded with them (default: script)
LOCAL_RANK = "LOCAL_RANK"  # set by torchrun: picks the core when NEURON_RT_VISIBLE_CORES is unset
NEURON_SIM_NODE = "NEURON_SIM_NODE"  # the simulated host this process is on (default: below)
NEURON_SHAPE_BUCKETS = "NEURON_SHAPE_BUCKETS"  # pow2 (default) | exact | "128,256": dynamic sizes
NEURON_RECORD_GRAPHS = "NEURON_RECORD_GRAPHS"  # a file: the precompile manifest (at exit)
NEURON_EXPLAIN = "NEURON_EXPLAIN"  # a file: torch.neuron.explain()'s report, written at exit
NEURON_LOG_LEVEL = "NEURON_LOG_LEVEL"  # debug | info (default) | warning | error | off
LOG_LEVELS = ("debug", "info", "warning", "error", "off")
# Set by torchrun: with more ranks in the job than on this node, the node rank names the host,
# so two torchrun --nnodes 2 launches on one machine are two simulated hosts.
GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE = "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"

TARGETS = ("trn1", "trn2")


class ConfigError(ValueError):
    """Unrecoverable: an environment variable has a value trnsim cannot use."""


@dataclass(frozen=True)
class Settings:
    target: str
    eager_mode: str
    core: int
    host_costs: str
    compile_clock: bool = True  # the simulated host waits for the modelled compile times
    numerics: bool = True  # ops compute values (off: shape-only, simulator/shape_only.py)


def _choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip().lower() or default
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not supported; use one of {', '.join(allowed)}")
    return value


def _core() -> int:
    """NEURON_RT_VISIBLE_CORES (first core of a range or list) wins over LOCAL_RANK."""
    visible = os.environ.get(NEURON_RT_VISIBLE_CORES, "").strip()
    if visible:
        first = visible.replace("-", ",").split(",")[0]
        if not first.isdigit():
            raise ConfigError(f"{NEURON_RT_VISIBLE_CORES}={visible!r}: expected e.g. '3' or '2-3'")
        return int(first)
    rank = os.environ.get(LOCAL_RANK, "0").strip() or "0"
    if not rank.isdigit():
        raise ConfigError(f"{LOCAL_RANK}={rank!r} is not a number")
    return int(rank)


def compile_daemon() -> str:
    """NEURON_COMPILE_DAEMON: "auto" (unset: the host's daemon, started if none answers),
    "off" (compile in process), or a daemon's address ("unix:/path", a socket path, host:port)."""
    return os.environ.get(NEURON_COMPILE_DAEMON, "auto").strip() or "auto"


def compile_deadline_s() -> float:
    """NEURON_COMPILE_DEADLINE: seconds a blocking compile waits for the daemon's answer
    before compiling in process (660: past the daemon's own 600 s limit)."""
    return _seconds(NEURON_COMPILE_DEADLINE, "660")


def health_deadline_s() -> float:
    """NEURON_COMPILE_HEALTH_DEADLINE: seconds the daemon has to show it is alive (1): to
    answer the first handshake, and a health check once a waiting request has heard nothing
    from it for that long. A daemon that does not is taken for hung: compiles go in process
    within about twice this, and the daemon is asked again later."""
    return _seconds(NEURON_COMPILE_HEALTH_DEADLINE, "1")


def direct_reads() -> bool:
    """NEURON_COMPILE_DIRECT_READS: whether this process reads cache hits from the daemon's
    disk tier itself (1, the default) or asks the daemon for every one (0)."""
    value = os.environ.get(NEURON_COMPILE_DIRECT_READS, "").strip().lower() or "1"
    if value not in ("1", "0", "on", "off"):
        raise ConfigError(f"{NEURON_COMPILE_DIRECT_READS}={value!r}: use 1 (the default) or 0")
    return value in ("1", "on")


def fast_door() -> bool:
    """NEURON_FAST_DOOR: whether the C++ door serves warm eager calls (on, the default) or
    every op takes the Python door (off)."""
    value = os.environ.get(NEURON_FAST_DOOR, "").strip().lower() or "on"
    if value not in ("on", "off", "1", "0"):
        raise ConfigError(f"{NEURON_FAST_DOOR}={value!r}: use on (the default) or off")
    return value in ("on", "1")


def _seconds(name: str, default: str) -> float:
    value = os.environ.get(name, "").strip() or default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(f"{name}={value!r}: expected seconds, e.g. {default}")
    return seconds


def compile_scale() -> float:
    """NEURON_SIM_COMPILE_SCALE: CPU seconds a compile in this process burns per modelled
    compile second (the daemon's workers read the same variable)."""
    try:
        return parse_scale(os.environ.get(NEURON_SIM_COMPILE_SCALE, ""))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def sim_node() -> str | None:
    """NEURON_SIM_NODE, else "node<GROUP_RANK>" in a torchrun job spanning several nodes,
    else None (the machine is the host). Collectives between different nodes go over EFA,
    and each node starts its own compile daemon."""
    node = os.environ.get(NEURON_SIM_NODE, "").strip()
    if node:
        if not all(c.isalnum() or c in "-_." for c in node):
            raise ConfigError(f"{NEURON_SIM_NODE}={node!r}: use letters, digits, '-', '_', '.'")
        return node
    try:
        world = int(os.environ.get(WORLD_SIZE, "1"))
        local = int(os.environ.get(LOCAL_WORLD_SIZE, str(world)))
        group = int(os.environ.get(GROUP_RANK, "0"))
    except ValueError:
        return None
    return f"node{group}" if world > local else None


def hostname() -> str:
    return socket.gethostname()


def profile_path() -> str:
    """NEURON_PROFILE: the file the process's profile is written to at exit ("": none)."""
    return os.environ.get(NEURON_PROFILE, "").strip()


def shape_buckets() -> str:
    """NEURON_SHAPE_BUCKETS: how dynamic sizes are bucketed, compiled mode's and eager ops'
    (policy/buckets.py)."""
    return os.environ.get(NEURON_SHAPE_BUCKETS, "")


def record_shapes() -> str:
    """NEURON_RECORD_SHAPES: the file op signatures are recorded into ("": not recording)."""
    return os.environ.get(NEURON_RECORD_SHAPES, "").strip()


def record_graphs() -> str:
    """NEURON_RECORD_GRAPHS: the precompile manifest this run's graphs are added to at exit
    ("": none); `trnsim precompile FILE` compiles them ahead of the next run."""
    return os.environ.get(NEURON_RECORD_GRAPHS, "").strip()


def explain_path() -> str:
    """NEURON_EXPLAIN: the file torch.neuron.explain()'s report is written to at exit."""
    return os.environ.get(NEURON_EXPLAIN, "").strip()


def record_source() -> str:
    """NEURON_RECORD_SOURCE: the model name recorded with the signatures ("": the script's)."""
    return os.environ.get(NEURON_RECORD_SOURCE, "").strip()


def log_level() -> str:
    """NEURON_LOG_LEVEL: the `trnsim` logger's level (client/core/progress.py)."""
    return _choice(NEURON_LOG_LEVEL, "info", LOG_LEVELS)


def announces_progress() -> bool:
    """Whether this process prints compile progress: under torchrun only local rank 0 does
    (once per host); a process outside torchrun always."""
    return (os.environ.get(LOCAL_RANK, "0").strip() or "0") == "0"


def read() -> Settings:
    return Settings(
        target=_choice(NEURON_SIM_TARGET, "trn2", TARGETS),
        eager_mode=_choice(NEURON_EAGER, "eager", ("eager", "adaptive")),
        core=_core(),
        host_costs=_choice(NEURON_SIM_HOST, "modelled", ("modelled", "measured")),
        compile_clock=_choice(NEURON_SIM_COMPILE_CLOCK, "on", ("on", "off")) == "on",
        numerics=_choice(NEURON_SIM_NUMERICS, "on", ("on", "off")) == "on",
    )
