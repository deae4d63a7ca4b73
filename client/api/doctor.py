"""The PyTorch half of `trnsim doctor`, run in a process of its own (the daemon's command
line never imports torch): torch's version, the device's autoload, and every NEURON_*
variable set. Prints one JSON object per check: {"name", "ok", "detail", "fix"}.

    python -m trnsim.client.api.doctor
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Callable
from typing import TypedDict

import torch
from trnsim.client.core import env
from trnsim.client.door import fast
from trnsim.policy import buckets
from trnsim.simulator import native

TORCH_VERSION = "2.13.0"  # the release trnsim is built and tested against (pyproject.toml)

# Variables trnsim reads: the client's (client/core/env.py) and the daemon's (daemon/config.py).
KNOWN = sorted(
    {v for k, v in vars(env).items() if k.startswith("NEURON_") and isinstance(v, str)}
    | {"NEURON_CACHE_DIR"}
)


class Check(TypedDict):
    """One check's outcome, printed as a JSON line."""

    name: str
    ok: bool
    detail: str
    fix: str  # what to do ("" when ok)


def _check(name: str, ok: bool, detail: str, fix: str = "") -> Check:
    return {"name": name, "ok": ok, "detail": detail, "fix": fix}


def check_torch() -> Check:
    version = torch.__version__.split("+")[0]
    if version != TORCH_VERSION:
        return _check(
            "torch",
            False,
            f"torch {torch.__version__}; trnsim is built against {TORCH_VERSION}",
            f"pip install torch=={TORCH_VERSION} (on the same command line as trnsim)",
        )
    return _check("torch", True, f"torch {torch.__version__}")


def check_device() -> Check:
    fix = (
        "reinstall trnsim (pip install -e . in its checkout): its torch.backends entry point "
        "registers the device on import torch"
    )
    try:
        x = torch.ones(4, device="neuron") + 1
        ok = bool(torch.equal(x.cpu(), torch.full((4,), 2.0)))
        detail = f"{torch.neuron.get_device_name()}, registered on import torch"
    except env.ConfigError as e:
        ok, detail, fix = False, str(e), "correct the variable (its own line below)"
    except native.NativeBuildError:
        ok, detail, fix = False, "trnsim's C++ parts are not built (below)", _BUILD_FIX
    except Exception as e:  # noqa: BLE001  (reported as the check's failure)
        ok, detail = False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return _check("device", ok, detail, "" if ok else fix)


_BUILD_FIX = "install g++ and ninja (apt-get install g++; pip install ninja), then run again"


def check_cpp_parts() -> Check:
    """trnsim's C++ parts: the simulated core's allocator and timeline (needed) and the C++
    door (warm eager calls without the Python door)."""
    try:
        core = native.module()
    except native.NativeBuildError as e:
        return _check("C++ parts", False, str(e), _BUILD_FIX)
    try:
        off = not env.fast_door()
    except env.ConfigError:  # (its own line below)
        off = True
    if fast.module() is not None:
        door = "the C++ door serves warm eager calls"
    elif off:
        door = f"the C++ door is off ({env.NEURON_FAST_DOOR})"
    else:
        door = "the C++ door is not built: every op takes the Python door (slower)"
    return _check(
        "C++ parts", True, f"native core in {os.path.dirname(str(core.__file__))}; {door}"
    )


# How each variable's value is checked: the same reader the runtime uses.
_VALIDATORS: dict[str, Callable[[], object]] = {
    env.NEURON_SIM_TARGET: env.read,
    env.NEURON_EAGER: env.read,
    env.NEURON_SIM_HOST: env.read,
    env.NEURON_SIM_COMPILE_CLOCK: env.read,
    env.NEURON_RT_VISIBLE_CORES: env.read,
    env.NEURON_COMPILE_DEADLINE: env.compile_deadline_s,
    env.NEURON_COMPILE_HEALTH_DEADLINE: env.health_deadline_s,
    env.NEURON_COMPILE_DIRECT_READS: env.direct_reads,
    env.NEURON_FAST_DOOR: env.fast_door,
    env.NEURON_SIM_COMPILE_SCALE: env.compile_scale,
    env.NEURON_SIM_NODE: env.sim_node,
    env.NEURON_SHAPE_BUCKETS: lambda: buckets.parse(env.shape_buckets()),
    env.NEURON_LOG_LEVEL: env.log_level,
}


# Prefixes of the Neuron SDK's own variables (runtime, compiler, frameworks): not typos of
# trnsim's, whatever they look like.
SDK_PREFIXES = ("NEURON_RT_", "NEURON_CC_", "NEURON_FRAMEWORK_", "NEURON_COMPILE_CACHE_")


def user_variables() -> dict[str, str]:
    """The NEURON_* variables to check: the user's, as `trnsim doctor` handed them over
    (this process runs with the daemon off and no output files), else this environment's."""
    handed = os.environ.get("TRNSIM_DOCTOR_VARIABLES")
    if handed is not None:
        return dict(json.loads(handed))
    return {k: v for k, v in os.environ.items() if k.startswith("NEURON_")}


def check_variables(variables: dict[str, str]) -> list[Check]:
    """Each variable checked by the runtime's own reader, with the user's values in place."""
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        return [_check_variable(name, variables[name]) for name in sorted(variables)]
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _check_variable(name: str, value: str) -> Check:
    if name not in KNOWN and not name.startswith(SDK_PREFIXES):
        near = difflib.get_close_matches(name, KNOWN, n=1, cutoff=0.8)
        if near:
            return _check(
                name,
                False,
                f"{name}={value!r} is not a trnsim variable",
                f"did you mean {near[0]}? rename it (trnsim ignores {name})",
            )
    if name not in KNOWN:
        return _check(name, True, f"{name}={value!r} (not read by trnsim)")
    validate = _VALIDATORS.get(name)
    try:
        if validate is not None:
            validate()
    except (env.ConfigError, ValueError) as e:
        return _check(name, False, str(e), "set a value the message names, or unset it")
    return _check(name, True, f"{name}={value!r}")


def main() -> int:
    variables = user_variables()
    checks = [check_torch(), check_device(), check_cpp_parts(), *check_variables(variables)]
    setting = variables.get(env.NEURON_COMPILE_DAEMON, "auto").strip() or "auto"
    checks.append(_check("compile daemon setting", True, setting))
    for c in checks:
        print(json.dumps(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
