"""Where a run's scalars go: the live series, every output, then the rules.

One path (``Monitor.emit``), so nothing skips the rules. Scalars of fast collected
steps may be held and passed on together (``monitor.batch`` says why and when): each
receiver then takes the whole list in turn, so its code and data stay in the caches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from msmon_nb.metrics.series import SeriesStore
from msmon_nb.monitor.batch import EmitBatch
from msmon_nb.sinks.base import Fanout

Items = list[tuple[int, float, dict[str, float]]]


class Outlet:
    """The series (the panel's source), the sink fan-out and the rules' ``observe``.

    ``observe(step, values)`` is the rules' entry (``monitor.actions``), None until the
    actions exist; ``guard(what, fn, *args)`` keeps a rule's failure from reaching the
    user's loop.
    """

    def __init__(self, guard: Callable[..., Any]) -> None:
        self.series = SeriesStore()
        self.sinks = Fanout([])
        self.observe: Callable[[int, Mapping[str, float]], Any] | None = None
        self.batch = EmitBatch()
        self._guard = guard

    def emit(self, step: int, values: Mapping[str, float]) -> None:
        """Scalars of ``step`` on their way; while holding (``batch.on``), fast steps'
        scalars wait for their batch, in order."""
        if not values:
            return
        wall = time.time()
        batch = self.batch
        if batch.on and batch.hold(step, wall, values):
            if batch.due():
                self.release()
            return
        self._pass_on([(step, wall, dict(values))])

    def release(self, when: bool = True) -> None:
        """Pass the held scalars on now (if ``when`` and any are held)."""
        if when and self.batch.items:
            self._pass_on(self.batch.take())

    def _pass_on(self, items: Items) -> None:
        for step, wall, values in items:
            self.series.add(step, wall, values)
        for step, wall, values in items:
            self.sinks.scalars(step, wall, values)
        if self.observe is not None:
            for step, _, values in items:
                self._guard("diagnosing", self.observe, step, values)
