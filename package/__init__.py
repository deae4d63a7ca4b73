"""trnsim: unchanged PyTorch training on a simulated AWS Trainium chip.

The device registers itself on `import torch` (trnsim.client); this module holds only the
version, so that importing it stays free of torch and of git until asked:

    trnsim.__version__   # "0.1.0+g1a2b3c4" (package version, then the git commit)
"""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["__version__", "commit", "package_version"]


def package_version() -> str:
    try:
        return metadata.version("trnsim")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


@functools.cache
def commit() -> str:
    """The git commit of the source tree this package runs from ("+dirty" with uncommitted
    changes), or "unknown" outside a git checkout (an installed wheel)."""
    source = Path(__file__).resolve().parent  # the checkout's package/, through the links

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(source), *args],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()

    try:
        top = Path(git("rev-parse", "--show-toplevel"))
        if not (top / "package" / "__init__.py").is_file():  # another project's checkout
            return "unknown"
        head = git("rev-parse", "--short=10", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


def __getattr__(name: str) -> str:
    if name == "__version__":
        sha = commit()
        local = sha.replace("+", ".") if sha != "unknown" else ""
        return f"{package_version()}+g{local}" if local else package_version()
    raise AttributeError(f"module 'trnsim' has no attribute {name!r}")
