"""Claiming run directories: unique names, rank dirs, the config backup.

A run dir is claimed with ``os.mkdir`` (atomic), so two processes asking for the same
name never share a directory: the second gets ``<name>.2``, ``<name>.3`` ...
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from msmon_nb.rundir.layout import CONFIG_BACKUP


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
