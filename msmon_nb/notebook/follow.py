"""``show(run, follow=True)``: a live panel for a run written by other processes.

A daemon thread re-reads the run (only what was appended) every ``interval`` seconds and
sends the new points to the same browser-drawn panel as ``%%msmonitor``; comm messages
from a thread reach the front end through ipykernel's IOPub thread, so this keeps
working after the cell has returned and the kernel is idle.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any, NamedTuple

import numpy as np

from msmon_nb.diagnose.rankrules import rank_alerts, with_cross_rank
from msmon_nb.events.runs import Run
from msmon_nb.metrics.charts import MAX_RANK_LINES
from msmon_nb.notebook.panel import Panel


class Follower:
    """Keeps a Panel in step with a run on disk until the run ends or ``stop()``."""

    def __init__(self, run: Run, interval: float = 1.0) -> None:
        self.run = run
        self.interval = interval
        self.panel = Panel(run.name, str(run.path), live=False)
        self.panel.state = "following"
        self._stop = threading.Event()
        self.updates = 0
        # a copy of the cell's context: the thread's messages keep the cell as parent
        self.thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._loop,),
            name=f"msmon-follow-{run.name}",
            daemon=True,
        )

    def start(self) -> Follower:
        self.draw()
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop following."""
        self._stop.set()

    def draw(self) -> None:
        """Read what was appended and redraw."""
        run = self.run
        run.refresh()
        series, alerts = run_series(run)
        panel = self.panel
        panel.set_data(series, alerts, run.snapshots, run.interventions)
        panel.state = "following" if run.status == "running" else run.status
        panel.send()
        self.updates += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.draw()
            except Exception as exc:  # noqa: BLE001 - a reader thread must not die silently
                self.panel.state = "follow stopped"
                self.panel.note = str(exc)
                self.panel.send()
                return
            if self.run.status not in ("running",):
                self.draw()
                return


class _Column(NamedTuple):
    steps: np.ndarray
    values: np.ndarray


def recorded_order(run: Run, tags: list[str]) -> list[str]:
    """``tags`` in the order the run first recorded them: the panel plans in its series'
    order, and an activations heatmap's rows are the forward order the sorted listing
    lost (``metrics.charts``)."""
    wanted = set(tags)
    first = [t for t in run.recorded_tags() if t in wanted]
    seen = set(first)
    return first + [t for t in tags if t not in seen]


def run_series(run: Run) -> tuple[dict[str, Any], list[Any]]:
    """What the panel draws for a run: its series, and its alerts.

    A distributed run gives one line per rank (``<tag>@rank<k>``, the first
    ``MAX_RANK_LINES`` ranks) plus the band across all ranks (``@min``/``@max``), and its
    cross-rank alerts next to each rank's own.
    """
    ranks = run.ranks
    if len(ranks) < 2:
        return {tag: run.scalars(tag) for tag in recorded_order(run, run.tags())}, run.alerts
    series: dict[str, Any] = {}
    for tag in recorded_order(run, run.tags(rank=ranks[0])):
        for rank in ranks[:MAX_RANK_LINES]:
            if tag in run.tags(rank=rank):
                series[f"{tag}@rank{rank}"] = run.scalars(tag, rank=rank)
        merged = run.merged(tag)
        series[f"{tag}@min"] = _Column(merged.steps, merged.min)
        series[f"{tag}@max"] = _Column(merged.steps, merged.max)
    alerts = with_cross_rank(run.alerts, [a.to_dict() for a in rank_alerts(run)])
    return series, alerts


def follow_run(run: Run, interval: float = 1.0) -> Any:
    """Start following ``run``; returns the panel widget (with ``.follower`` attached)."""
    follower = Follower(run, interval).start()
    widget = follower.panel.widget
    widget.follower = follower
    return widget
