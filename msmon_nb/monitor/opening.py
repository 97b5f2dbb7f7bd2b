"""Open a run on disk: claim its dir, back up the config, write the first marker.

One job, apart from ``Monitor`` so that what a run dir holds when training starts
(``docs/ARCHITECTURE.md``, run layout) is decided in one place: a single process claims
``<save_dir>/<run>``; the ranks of a distributed job share one run name and each claims
``rank_<k>/`` below it (``rundir.claim``).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msmon_nb.collect.rankinfo import RankInfo, shared_run_name
from msmon_nb.config import MonitorConfig, MonitorWarning
from msmon_nb.rundir import (
    backup_config,
    claim_rank_dir,
    claim_run_dir,
    default_run_name,
    environment,
    write_marker,
)


@dataclass
class OpenedRun:
    """Where a run lives: ``run_dir`` (shared by every rank), ``write_dir`` (this
    process's: the run dir or its ``rank_<k>/``), and the marker as first written."""

    run_dir: Path
    write_dir: Path
    marker: dict[str, Any]


def open_run(cfg: MonitorConfig, ranks: RankInfo) -> OpenedRun:
    """Claim the run dir for ``cfg`` and write its config backup and ``running`` marker.

    A ``run_name`` that is taken gets a fresh name and a warning, so runs never mix.
    Raises ``OSError`` when the disk refuses (the Monitor then keeps curves in memory).
    """
    if ranks.distributed:
        name = cfg.run_name or shared_run_name(cfg.model_name)
        run_dir, write_dir = claim_rank_dir(cfg.save_dir, name, ranks.rank)
    else:
        name = cfg.run_name or default_run_name(cfg.model_name)
        run_dir = write_dir = claim_run_dir(cfg.save_dir, name)
    if cfg.run_name and run_dir.name != cfg.run_name:
        warnings.warn(
            f"msmon: run {cfg.run_name!r} already exists in {cfg.save_dir}; "
            f"writing to {run_dir.name!r} instead, so runs never mix",
            MonitorWarning,
            stacklevel=3,
        )
    backup_config(write_dir, cfg.to_dict(), getattr(cfg, "_source", None))
    marker = {
        "run_name": run_dir.name,
        "project_name": cfg.project_name,
        "status": "running",
        "start": time.time(),
        "rank": ranks.rank,
        "ranks": ranks.size,
        "config": cfg.to_dict(),
        **environment(),
    }
    write_marker(write_dir, marker)
    return OpenedRun(run_dir, write_dir, marker)


def close_marker(write_dir: Path, marker: dict[str, Any], status: str, **facts: Any) -> None:
    """Rewrite the run's marker as it ended: ``status`` (finished, stopped, interrupted),
    the end time and ``facts`` (steps, last step, alerts, failed outputs). Raises
    ``OSError`` when the disk refuses."""
    marker.update(facts, status=status, end=time.time())
    write_marker(write_dir, marker)
