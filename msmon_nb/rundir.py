"""Run directories: unique names, the ``msmon_run.json`` marker, the config backup.

A run dir is claimed with ``os.mkdir`` (atomic), so two processes asking for the same
name never share a directory: the second gets ``<name>.2``, ``<name>.3`` ...
The marker is replaced atomically (write + rename), so readers never see half a file.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from msmon_nb.events.runs import MARKER, read_marker_file

CONFIG_BACKUP = "config_backup"


def default_run_name(model: str | None = None, now: float | None = None) -> str:
    """``<model>_<YYYYmmdd>_<HHMMSS>``."""
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now))
    return f"{model or 'run'}_{stamp}"


def claim_run_dir(save_dir: str | os.PathLike[str], name: str) -> Path:
    """Create and return ``save_dir/name``, or ``name.2``, ``name.3``... if taken."""
    base = Path(save_dir)
    base.mkdir(parents=True, exist_ok=True)
    candidate = base / name
    n = 1
    while True:
        try:
            candidate.mkdir(mode=0o700)
            return candidate
        except FileExistsError:
            n += 1
            candidate = base / f"{name}.{n}"


def claim_rank_dir(save_dir: str | os.PathLike[str], name: str, rank: int) -> tuple[Path, Path]:
    """(run dir, ``rank_<rank>`` dir) for one rank of a distributed job.

    Every rank takes the first of ``name``, ``name.2``... whose ``rank_<rank>`` dir it can
    create: ranks of one job that reuse an old job's name all step past the same old
    dirs, so they still agree, with no communication between them.
    """
    base = Path(save_dir)
    n = 1
    while True:
        run_dir = base / (name if n == 1 else f"{name}.{n}")
        rank_dir = run_dir / f"rank_{rank}"
        try:
            run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            rank_dir.mkdir(mode=0o700)
            return run_dir, rank_dir
        except FileExistsError:
            n += 1


def environment() -> dict[str, Any]:
    """Versions and host facts recorded with every run (the seed's self-check)."""
    from msmon_nb import __version__

    info: dict[str, Any] = {
        "msmon_nb": __version__,
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
    from msmon_nb.doctor import quick_facts  # the cheap part of `msmon doctor`

    info.update(quick_facts())
    return info


def write_marker(run_dir: Path, data: dict[str, Any]) -> None:
    """Atomically replace ``run_dir/msmon_run.json`` with ``data``."""
    tmp = run_dir / f".{MARKER}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        tmp.replace(run_dir / MARKER)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def read_marker(run_dir: Path) -> dict[str, Any] | None:
    """The marker of ``run_dir``, or None."""
    return read_marker_file(run_dir / MARKER)


def backup_config(run_dir: Path, config: dict[str, Any], source: str | None) -> Path:
    """Copy the config as used (and the YAML it came from) to ``run_dir/config_backup``."""
    import yaml

    dest = run_dir / CONFIG_BACKUP
    dest.mkdir(exist_ok=True)
    (dest / "monitor_config.yaml").write_text(
        yaml.safe_dump({"monitor_config": config}, sort_keys=True)
    )
    if source:
        try:
            shutil.copy2(source, dest / f"source_{Path(source).name}")
        except OSError:
            pass
    return dest
