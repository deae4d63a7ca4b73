"""The simulated core's accounting in C++ (accounting.h, bound by native.cpp): the HBM
allocator and the timeline that every op's launch and every allocation goes through, and
that the C++ door (client/door/fast_door.cpp) accounts a warm eager call with, without a
Python call per step. simulator/memory.py and simulator/device.py give them their Python
names.

It is built from its source on first use (g++ with pybind11's headers, which come with
torch; about 10 s, once per machine and source) into $XDG_CACHE_HOME/trnsim/native/<source
hash> (default ~/.cache), and loaded from there after. Without a compiler there is no
simulated core: the error says what to install. `load_built` here also loads the C++ door
(client/door/fast.py builds it with torch's extension builder). Nothing here imports
torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).parent
SOURCES = (HERE / "native.cpp", HERE / "accounting.h")  # (compiled, then included)
NAME = "trnsim_native"

_module: ModuleType | None = None


class NativeBuildError(RuntimeError):
    """trnsim's C++ parts could not be built: the message names the missing tool."""


def cache_home() -> Path:
    """XDG_CACHE_HOME, else ~/.cache: where trnsim keeps what it builds (the native core
    and the C++ door)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def build_directory(kind: str, sources: Sequence[Path], built_for: str) -> Path:
    """Where a module is built: per source and what it is built for (Python, torch), so a
    change rebuilds it."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources) + built_for.encode())
    return cache_home() / "trnsim" / kind / digest.hexdigest()[:12]


def built_for() -> str:
    """The Python and torch a module is built for (pybind11's headers are torch's)."""
    return (
        f"{sys.version} {sysconfig.get_config_var('EXT_SUFFIX')} "
        f"torch {importlib.metadata.version('torch')}"
    )


def load_built(
    name: str,
    kind: str,
    sources: Sequence[Path],
    build_with: Callable[[Path, Path], None],
    tools: Sequence[str],
    build: bool = True,
) -> ModuleType | None:
    """The module `name` built from sources (the first one compiled, the rest headers it
    includes from its own folder) by build_with(where, so_file), which needs `tools`:
    loaded if built, else built now when `build` (None if not). Raises NativeBuildError
    when it cannot be built or loaded."""
    where = build_directory(kind, sources, built_for())
    built = where / f"{name}.so"
    try:
        if not built.exists():
            if not build:
                return None
            print(
                f"trnsim: building its C++ {kind} (once per machine and version) in {where}",
                file=sys.stderr,
                flush=True,
            )
            where.mkdir(parents=True, exist_ok=True)
            build_with(where, built)
        spec = importlib.util.spec_from_file_location(name, built)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, RuntimeError, ImportError, subprocess.CalledProcessError) as e:
        text = str(getattr(e, "stderr", None) or e).strip()
        missing = [tool for tool in tools if shutil.which(tool) is None]
        what_to_do = (
            f"Install {' and '.join(missing)} (apt-get install g++; pip install ninja), then "
            f"run again: it builds once per machine and version."
            if missing
            else f"The compiler's output is in {where} (Python's headers, python3-dev, "
            f"are needed too)."
        )
        raise NativeBuildError(
            f"trnsim's C++ {kind} could not be built or loaded in {where} "
            f"({type(e).__name__}: {text.splitlines()[-1] if text else repr(e)}). {what_to_do}"
        ) from e
    return module


def _compile(where: Path, built: Path) -> None:
    """The native core, by g++ with pybind11's headers (torch's copy; torch is not
    imported), into a file of its own then renamed: a process never loads a half-written
    one, whichever of several building at once finishes first."""
    torch_spec = importlib.util.find_spec("torch")
    if torch_spec is None or not torch_spec.submodule_search_locations:
        raise ImportError("torch is not installed (pybind11's headers come with it)")
    include = Path(next(iter(torch_spec.submodule_search_locations))) / "include"
    partial = where / f"{NAME}.{os.getpid()}.so"
    done = subprocess.run(
        [
            "g++",
            "-O2",
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            f"-I{HERE}",
            f"-I{include}",
            f"-I{sysconfig.get_paths()['include']}",
            str(SOURCES[0]),
            "-o",
            str(partial),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    (where / "build.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise subprocess.CalledProcessError(done.returncode, "g++", stderr=done.stderr)
    os.replace(partial, built)


def module() -> ModuleType:
    """The native core's module, built on first use (NativeBuildError if it cannot be)."""
    global _module
    if _module is None:
        loaded = load_built(NAME, "native", SOURCES, _compile, ("g++",))
        assert loaded is not None
        _module = loaded
    return _module


def main() -> None:
    """`make door` (and `make setup`): build the native core now, or say why not."""
    import argparse

    argparse.ArgumentParser(
        prog="python -m trnsim.simulator.native",
        description="Builds trnsim's native core (the simulated HBM allocator and timeline "
        "in C++; g++, about 10 s) if it is not built yet, loads it and says where it is. "
        "trnsim builds it on first use otherwise.",
    ).parse_args()
    try:
        module()
    except NativeBuildError as e:
        sys.exit(str(e))
    print(f"trnsim: native core ready in {build_directory('native', SOURCES, built_for())}")


if __name__ == "__main__":
    main()
