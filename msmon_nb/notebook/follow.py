"""``show(run, follow=True)``: a live panel for a run written by other processes.

A daemon thread re-reads the run (only what was appended) every ``interval`` seconds and
redraws; widget updates from a thread reach the front end through ipykernel's IOPub
thread, so this keeps working after the cell has returned and the kernel is idle.
"""

from __future__ import annotations

import threading
from typing import Any

from msmon_nb.events.runs import Run


class Follower:
    """Keeps a Panel in step with a run on disk until the run ends or ``stop()``."""

    def __init__(self, run: Run, interval: float = 1.0) -> None:
        from msmon_nb.notebook.panel import Panel

        self.run = run
        self.interval = interval
        self.panel = Panel(run.name, str(run.path), live=False)
        self._stop = threading.Event()
        self.updates = 0
        self.thread = threading.Thread(
            target=self._loop, name=f"msmon-follow-{run.name}", daemon=True
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
        series = {tag: run.scalars(tag) for tag in run.tags()}
        self.panel.show_series(series, run.alerts)
        self.panel.status.value = (
            f"&nbsp;<b>{run.status}</b> &middot; last step {run.last_step} &middot; following"
        )
        self.updates += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.draw()
            except Exception as exc:  # noqa: BLE001 - a reader thread must not die silently
                self.panel.status.value = f"&nbsp;<b>follow stopped</b>: {exc}"
                return
            if self.run.status not in ("running",):
                self.draw()
                return


def follow_run(run: Run, interval: float = 1.0) -> Any:
    """Start following ``run``; returns the panel widget (with ``.follower`` attached)."""
    follower = Follower(run, interval).start()
    widget = follower.panel.widget
    widget.follower = follower
    return widget
