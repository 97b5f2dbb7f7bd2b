"""The run's alerts, snapshot entries and interventions on disk: every writer goes
through here.

An alert is kept in ``alerts.jsonl`` with its wall time (and the action taken, or
``cross_rank`` for the cross-rank watcher's); a tensor summary gets one line in
``snapshots.jsonl`` (its data lives in the summary events); an intervention (a command
or an alert action that changes training: pause, resume, stop, freq, lr, checkpoint,
skip) gets one line in ``interventions.jsonl``, so a run read back later says what was
done to it, when and by whom, and the pages draw it on the charts. Written by the
monitor (rules, ``overhead_budget``, the command interpreter), its actions (snapshots,
skips) and the cross-rank watcher (its own process): one format, one place. A write
that fails goes through the caller's ``guard`` (warned once; training goes on).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msmon_nb.rundir import ALERTS, INTERVENTIONS, SNAPSHOTS, append_jsonl, read_jsonl
from msmon_nb.rundir.control import SPECS


def _unguarded(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


# who acted, by the road a command came by (``monitor.controls``' ``source``)
WHO = {"panel": "panel", "msmon ctl": "ctl", "msmon view": "viewer", "%msmonitor": "magic"}
ALERT_ACTION = "alert action"


def intervention(
    step: int | None,
    who: str,
    what: str,
    arg: Any,
    ok: bool,
    message: str,
    rank: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One intervention as ``interventions.jsonl`` keeps it (and the panel receives it):
    ``{step, time, who, what, arg, label, ok, message, rank}`` plus ``extra`` (a
    checkpoint's ``path`` and ``bytes``); ``label`` is what the charts' mark says."""
    return dict(
        step=step,
        time=time.time(),
        who=WHO.get(who, who or "api"),
        what=what,
        arg=arg,
        label=label(what, arg),
        ok=bool(ok),
        message=message,
        rank=rank,
        **extra,
    )


def label(what: str, arg: Any) -> str:
    """A mark's words: a command as typed (``lr x0.5``, ``freq 10``), an alert action
    with its kind (``skip grad_explosion``)."""
    spec = SPECS.get(what)
    if arg is None:
        return what
    if spec is not None and spec.arg is not None and isinstance(arg, int | float):
        return f"{what} {spec.arg.prefixes[:1]}{arg:g}"
    return f"{what} {arg}"


class RunRecords:
    """``alerts.jsonl``, ``snapshots.jsonl`` and ``interventions.jsonl`` of one run (or
    rank) dir; nothing is written when ``write_dir`` is None (a disabled monitor, or a
    disk that refused the run: the in-memory list still feeds the panel)."""

    def __init__(self, write_dir: Path | None, guard: Callable[..., Any] = _unguarded) -> None:
        self.write_dir = write_dir
        self.guard = guard
        self.interventions: list[dict[str, Any]] = []  # this process's, for the panel

    def intervention(self, entry: dict[str, Any]) -> None:
        """Keep and append one intervention (an ``intervention(...)`` dict)."""
        self.interventions.append(entry)
        if self.write_dir is not None:
            path = self.write_dir / INTERVENTIONS
            self.guard("writing interventions.jsonl", append_jsonl, path, entry)

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
