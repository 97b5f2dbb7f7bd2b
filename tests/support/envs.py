"""Running ``msmon doctor`` and a monitored no-op in a given interpreter, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

# Collected, watched and written for real in each venv: the marker and the verbose line.
MONITOR_SCRIPT = r"""
import sys
import mindspore
from msmon_nb import Monitor
with Monitor(save_dir=sys.argv[1], run_name="env", verbose=True) as mon, mon.watch():
    pass
"""


# a developer's own Jupyter paths, and a protobuf choice that would change what is reported
_DROPPED = ("JUPYTER_PATH", "PYTHONPATH", "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child, with GLOG_v=3 as CI sets it."""
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    env.update(GLOG_v="3", PYTHONUNBUFFERED="1", **extra)
    return env


def start_doctor(python: str | Path, *args: str, env: dict[str, str], cwd: Path, json_out=True):
    """``<python> -m msmon_nb.cli doctor [--json] ARGS`` started, not waited for."""
    argv = [str(python), "-m", "msmon_nb.cli", "doctor", *(["--json"] if json_out else []), *args]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    )


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def doctor_json(proc: subprocess.Popen[str]) -> tuple[int, dict]:
    code, out, err = finish(proc)
    try:
        return code, json.loads(out)
    except ValueError as exc:
        raise AssertionError(f"not JSON ({code}):\n{out}\nstderr:\n{err}") from exc


def start_monitor(python: str | Path, save_dir: Path, env: dict[str, str], cwd: Path):
    return subprocess.Popen(
        [str(python), "-c", MONITOR_SCRIPT, str(save_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}
