"""The run's alerts and snapshot entries on disk: every writer goes through here.

An alert is kept in ``alerts.jsonl`` with its wall time (and the action taken, or
``cross_rank`` for the cross-rank watcher's); a tensor summary gets one line in
``snapshots.jsonl`` (its data lives in the summary events). Written by the monitor
(rules, ``overhead_budget``), its actions (snapshots) and the cross-rank watcher (its
own process): one format, one place. A write that fails goes through the caller's
``guard`` (warned once; training goes on).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msmon_nb.rundir import ALERTS, SNAPSHOTS, append_jsonl, read_jsonl


def _unguarded(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class RunRecords:
    """``alerts.jsonl`` and ``snapshots.jsonl`` of one run (or rank) dir; nothing is
    written when ``write_dir`` is None (a disabled monitor)."""

    def __init__(self, write_dir: Path | None, guard: Callable[..., Any] = _unguarded) -> None:
        self.write_dir = write_dir
        self.guard = guard

    def alert(self, alert: Any, **fields: Any) -> None:
        """Append ``alert`` (a ``diagnose.Alert``) with ``fields`` (``action=``...)."""
        if self.write_dir is not None:
            data = dict(alert.to_dict(), **fields, wall_time=time.time())
            self.guard("writing alerts.jsonl", append_jsonl, self.write_dir / ALERTS, data)

    def snapshot(self, entry: dict[str, Any]) -> None:
        """Append one tensor summary's entry."""
        if self.write_dir is not None:
            path = self.write_dir / SNAPSHOTS
            self.guard("writing snapshots.jsonl", append_jsonl, path, entry)

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts written so far (by any process)."""
        return read_jsonl(self.write_dir / ALERTS) if self.write_dir is not None else []
