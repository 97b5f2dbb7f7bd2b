"""Which rank this process is, in how large a job, and the run name all ranks agree on.

Rank and group size come from ``mindspore.communication`` once ``init()`` ran, else
from the environment ``msrun`` exports to every worker (``RANK_ID``, ``RANK_SIZE`` /
``MS_WORKER_NUM``). No collective is used: the ranks agree on a run name by deriving
it from what they share -- the job's scheduler port and the start time of the
``msrun`` process that launched them -- so nothing races on the file system.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in a distributed job."""

    rank: int = 0
    size: int = 1

    @property
    def distributed(self) -> bool:
        """True when more than one rank writes into the run."""
        return self.size > 1

    @property
    def label(self) -> int | None:
        """The rank records carry (alerts, interventions): None when not distributed,
        so a one-process run's records do not read as "rank 0 of a job"."""
        return self.rank if self.distributed else None


def detect() -> RankInfo:
    """This process's rank and the job's size (``RankInfo(0, 1)`` when not distributed)."""
    comm = sys.modules.get("mindspore.communication")
    if comm is not None:
        try:
            from mindspore.communication import GlobalComm, get_group_size, get_rank

            if GlobalComm.INITED:
                return RankInfo(int(get_rank()), int(get_group_size()))
        except (ImportError, RuntimeError, ValueError):
            pass
    env = os.environ
    size = env.get("RANK_SIZE") or env.get("MS_WORKER_NUM")
    rank = env.get("RANK_ID") or env.get("MS_NODE_ID")
    if size and rank and size.isdigit() and rank.isdigit() and int(size) > 1:
        return RankInfo(int(rank), int(size))
    return RankInfo()


def shared_run_name(model: str | None) -> str:
    """A default run name every rank of one msrun job computes identically.

    ``<model>_<YYYYmmdd_HHMMSS of the launcher's start>_p<scheduler port>``. Local
    workers share their parent (msrun); ranks on other hosts should set ``run_name``
    (or ``MSMON_RUN_NAME``), since their launchers start at different times.
    """
    forced = os.environ.get("MSMON_RUN_NAME")
    if forced:
        return forced
    started = time.time()
    try:
        import psutil

        started = psutil.Process(os.getppid()).create_time()
    except (ImportError, OSError):
        pass
    port = os.environ.get("MS_SCHED_PORT", "0")
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(started))
    return f"{model or 'run'}_{stamp}_p{port}"
