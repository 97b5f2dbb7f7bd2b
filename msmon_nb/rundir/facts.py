"""Facts about this environment kept with every run: versions, host, known problems.

Cheap enough for a training process (a few ms, no subprocess, nothing imported that the
process has not loaded): ``environment()`` fills the ``msmon_run.json`` marker;
``msmon doctor`` builds its full report on the same helpers.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from importlib import metadata
from typing import Any

# The last MindSpore release known to be built against NumPy 1.x; later ones are judged
# by what the doctor's probe sees.
NUMPY1_MINDSPORE = (2, 10)


def version_tuple(text: str | None) -> tuple[int, ...]:
    """``"2.10.0rc1"`` -> ``(2, 10, 0)``; the leading dotted integers only."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (no import), or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def loaded_version(module: str, dist: str) -> str | None:
    """The version of ``module`` if this process has imported it, else the installed one."""
    mod = sys.modules.get(module)
    version = getattr(mod, "__version__", None) if mod is not None else None
    return str(version) if version else dist_version(dist)


def numpy_problem(numpy_version: str | None, mindspore_version: str | None) -> str | None:
    """Why this numpy cannot serve this MindSpore, or None (static rule, no import)."""
    np_v, ms_v = version_tuple(numpy_version), version_tuple(mindspore_version)
    if not np_v or not ms_v or np_v[0] < 2 or ms_v[:2] > NUMPY1_MINDSPORE:
        return None
    return (
        f"MindSpore {mindspore_version} is built against NumPy 1.x; with numpy "
        f"{numpy_version} its first Tensor->numpy conversion prints 'A module that was "
        "compiled using NumPy 1.x cannot be run in NumPy 2...' and logs 'Numpy init failed'"
    )


NUMPY_FIX = "pip install 'numpy<2'"


def mindspore_brief() -> str:
    """``"MindSpore 2.10.0 on CPU"`` for the process's loaded MindSpore (never imports it)."""
    ms = sys.modules.get("mindspore")
    if ms is None:
        return "MindSpore not imported"
    try:
        device = ms.get_context("device_target")
    except (RuntimeError, ValueError, AttributeError):
        device = "unknown device"
    return f"MindSpore {getattr(ms, '__version__', '?')} on {device}"


def quick_facts() -> dict[str, Any]:
    """Versions worth keeping with a run, read in a few ms inside a training process.

    Modules already imported are asked directly; the rest by installed metadata. Nothing
    heavy is imported, no subprocess is started and no kernel is scanned.
    """
    facts: dict[str, Any] = {
        "numpy": loaded_version("numpy", "numpy"),
        "protobuf": loaded_version("google.protobuf", "protobuf"),
        "protobuf_implementation": None,
        "ipykernel": loaded_version("ipykernel", "ipykernel"),
        "ipywidgets": loaded_version("ipywidgets", "ipywidgets"),
    }
    if "google.protobuf" in sys.modules:
        # the implementation is fixed when protobuf is first imported, so asking costs
        # nothing here and cannot change what the process already runs
        from google.protobuf.internal import api_implementation

        facts["protobuf_implementation"] = api_implementation.Type()
    problems: list[dict[str, str]] = []
    ms = sys.modules.get("mindspore")
    reason = numpy_problem(facts["numpy"], getattr(ms, "__version__", None))
    if reason:
        problems.append({"name": "numpy", "detail": reason, "fix": NUMPY_FIX})
    facts["env_problems"] = problems
    return facts


def msmon_version() -> str | None:
    """This package's version. The package is imported before any of its modules, so it
    is read from ``sys.modules`` (no import of the root, which sits above every room)."""
    return getattr(sys.modules.get("msmon_nb"), "__version__", None)


def environment() -> dict[str, Any]:
    """Versions and host facts recorded with every run (the seed's self-check)."""
    info: dict[str, Any] = {
        "msmon_nb": msmon_version(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    ms = sys.modules.get("mindspore")
    if ms is not None:
        info["mindspore"] = getattr(ms, "__version__", "unknown")
        try:
            info["device"] = ms.get_context("device_target")
        except (RuntimeError, ValueError, AttributeError):
            info["device"] = "unknown"
    np_mod = sys.modules.get("numpy")
    if np_mod is not None:
        info["numpy"] = np_mod.__version__
    info.update(quick_facts())
    return info
