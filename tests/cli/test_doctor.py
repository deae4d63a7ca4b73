"""`trnsim doctor` and `trnsim --version`, as a user runs them: real processes."""

from __future__ import annotations

import os
import subprocess
import sys

TRNSIM = [sys.executable, "-m", "trnsim.cli"]


def test_doctor_fails_on_a_cache_directory_open_to_others_and_a_misspelt_variable(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = {
        **{k: v for k, v in os.environ.items() if k != "NEURON_COMPILE_DAEMON"},  # auto
        "NEURON_CACHE_DIR": str(cache),
        "NEURON_EAGR": "adaptive",
        "NEURON_RECORD_GRAPHS": str(tmp_path / "run.graphs"),  # a run's output, not ours
        "XDG_RUNTIME_DIR": str(run),
    }
    out = subprocess.run(
        [*TRNSIM, "doctor"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    lines = out.stdout.splitlines()
    assert out.returncode == 1, out.stdout + out.stderr
    assert any(line.startswith("ok    torch: torch 2.13.0") for line in lines)
    assert any(line.startswith("ok    device: simulated") for line in lines)
    assert any(line.startswith("ok    C++ parts: native core in ") for line in lines)
    assert any(line.startswith("ok    daemon: none running on unix:") for line in lines)
    assert not (run / "trnsim" / "compiler.sock").exists(), "the doctor starts no daemon"
    assert not (tmp_path / "run.graphs").exists(), "nor writes a run's files"
    failed = {
        line.split(":")[0].removeprefix("FAIL  ") for line in lines if line.startswith("FAIL")
    }
    assert failed == {"cache directory", "NEURON_EAGR"}, out.stdout
    assert f"fix: chmod 700 {cache}" in out.stdout
    assert "did you mean NEURON_EAGER?" in out.stdout
    assert lines[-1].endswith("2 failed")
    assert oct(cache.stat().st_mode & 0o777) == "0o755", "the doctor changes nothing"


def test_version_names_the_package_version_and_the_commit():
    out = subprocess.run([*TRNSIM, "--version"], capture_output=True, text=True, check=True)
    import trnsim

    assert out.stdout.startswith(f"trnsim {trnsim.package_version()} (commit ")
    assert trnsim.__version__.startswith(trnsim.package_version())
