"""Where the daemon listens and keeps its cache, and its limits; the environment variables
the daemon reads are read here: NEURON_CACHE_DIR, XDG_RUNTIME_DIR, XDG_CACHE_HOME,
NEURON_SIM_NODE, NEURON_SIM_COMPILE_SCALE, NEURON_CACHE_REMOTE (with _KEY_FILE and
_DEADLINE), TRNSIM_ALLOW_TCP, and systemd's CACHE_DIRECTORY and NOTIFY_SOCKET."""

from __future__ import annotations

import getpass
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from trnsim.compiler.compile_time import parse_scale

SYSTEM_SOCKET = "/run/trnsim/compiler.sock"
SYSTEM_CACHE = "/var/cache/trnsim"
WORKER_MEMORY_BYTES = 512 * 1024 * 1024  # what one compile worker may need at most [E]


class ConfigError(ValueError):
    """Unrecoverable: the daemon cannot use this address or directory; the message says why."""


def user_runtime_dir() -> Path:
    """$XDG_RUNTIME_DIR/trnsim, else a 0700 directory under the temp dir named for the user."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "trnsim"
    return Path(tempfile.gettempdir()) / f"trnsim-{getpass.getuser()}"


def default_address(node: str | None = None) -> str:
    """This user's daemon socket; a simulated host (node, else NEURON_SIM_NODE) other than
    the machine itself has its own daemon: compiler-<node>.sock. (The client names torchrun's
    node itself: client/core/env.py sim_node.)"""
    node = node or env_node()
    name = f"compiler-{node}.sock" if node else "compiler.sock"
    return f"unix:{user_runtime_dir() / name}"


def env_node() -> str | None:
    """NEURON_SIM_NODE: the simulated host whose daemon this is (None: the machine's)."""
    node = os.environ.get("NEURON_SIM_NODE", "").strip()
    if node and not all(c.isalnum() or c in "-_." for c in node):
        raise ConfigError(f"NEURON_SIM_NODE={node!r}: use letters, digits, '-', '_', '.'")
    return node or None


def remote_url() -> str:
    """NEURON_CACHE_REMOTE: the cluster tier's store ("": none)."""
    return os.environ.get("NEURON_CACHE_REMOTE", "").strip()


def remote_key_file() -> Path | None:
    """NEURON_CACHE_REMOTE_KEY_FILE: the cluster key that signs the remote tier's entries."""
    value = os.environ.get("NEURON_CACHE_REMOTE_KEY_FILE", "").strip()
    return Path(value) if value else None


def remote_deadline_s() -> float:
    """NEURON_CACHE_REMOTE_DEADLINE: seconds one call to the remote store may take (0.5)."""
    value = os.environ.get("NEURON_CACHE_REMOTE_DEADLINE", "").strip() or "0.5"
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 60:
        raise ConfigError(f"NEURON_CACHE_REMOTE_DEADLINE={value!r}: seconds, above 0, up to 60")
    return seconds


def default_cache_dir() -> Path:
    env = os.environ.get("NEURON_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trnsim"


def system_cache_dir() -> Path:
    """The system daemon's cache: systemd's CACHE_DIRECTORY (CacheDirectory=), else /var/cache."""
    return Path(os.environ.get("CACHE_DIRECTORY", SYSTEM_CACHE))


def compile_scale() -> float:
    """NEURON_SIM_COMPILE_SCALE: CPU seconds a compile burns per modelled compile second."""
    try:
        return parse_scale(os.environ.get("NEURON_SIM_COMPILE_SCALE", ""))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def tcp_allowed() -> bool:
    """TRNSIM_ALLOW_TCP=1: the daemon may listen on a TCP address beyond loopback."""
    return os.environ.get("TRNSIM_ALLOW_TCP") == "1"


def systemd_notify_socket() -> str:
    """NOTIFY_SOCKET: where systemd (Type=notify) listens for READY=1 ("": not under it)."""
    return os.environ.get("NOTIFY_SOCKET", "")


def default_workers() -> int:
    """One per CPU, fewer if free memory cannot hold that many compiles."""
    cpus = os.cpu_count() or 1
    by_memory = psutil.virtual_memory().available // WORKER_MEMORY_BYTES
    return max(1, min(cpus, int(by_memory)))


def ensure_private_dir(path: Path, mode: int = 0o700) -> None:
    """A directory only this user can enter: created with `mode`, or an existing one that
    already is. Never follows a symbolic link and never changes the mode of a directory it
    did not create (someone else's, or a shared one, is refused with the reason)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=mode)
        os.chmod(path, mode, follow_symlinks=False)  # (mkdir's mode passes through the umask)
        return
    except FileExistsError:
        pass
    check_private_dir(path, mode)


def check_private_dir(path: Path, mode: int = 0o700) -> None:
    """Raises ConfigError unless path is a real directory of this user, closed to others."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{path} is a symbolic link; trnsim uses only real directories there")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise ConfigError(
            f"{path} belongs to uid {st.st_uid}, not to you: another user may have created it "
            f"to intercept your compiles; remove it or set XDG_RUNTIME_DIR"
        )
    if st.st_mode & 0o777 & ~mode:
        raise ConfigError(
            f"{path} is open to other users (mode {st.st_mode & 0o777:o}); "
            f"run `chmod {mode:o} {path}` or remove it"
        )


def socket_path(address: str) -> Path | None:
    return Path(address[len("unix:") :]) if address.startswith("unix:") else None


@dataclass
class DaemonConfig:
    address: str = field(default_factory=default_address)
    cache_dir: Path = field(default_factory=default_cache_dir)
    system: bool = False  # systemd mode: socket 0660 for a group instead of 0600
    memory_cache_bytes: int = 256 * 1024 * 1024
    disk_cache_bytes: int = 4 * 1024 * 1024 * 1024
    workers: int = field(default_factory=default_workers)
    compile_timeout_s: float = 600.0
    error_ttl_s: float = 600.0  # deterministic compile errors are remembered this long
    idle_exit_s: float | None = None  # auto-started daemons exit after this long idle
    max_request_bytes: int = 64 * 1024 * 1024
    max_nodes: int = 100_000
    max_streams: int = 1024
    drain_timeout_s: float = 30.0
    # The cluster tier (daemon/remote.py): its store ("": none), the key that signs its
    # entries, the deadline of one call, and the largest entry written or read.
    remote: str = field(default_factory=remote_url)
    remote_key_file: Path | None = field(default_factory=remote_key_file)
    remote_deadline_s: float = field(default_factory=remote_deadline_s)
    remote_max_entry_bytes: int = 64 * 1024 * 1024
