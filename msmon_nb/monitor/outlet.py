"""Where a run's scalars go: the live series, every output, then the rules.

One path (``Monitor.emit``), so nothing skips the rules. Scalars of fast collected
steps may be held and passed on together (``Monitor.hold_emits``); each receiver then
takes the whole list in turn, so its code and data stay in the caches.

Why: in ``Model.train`` the callback's work runs once per step, right after a graph
run has pushed Python's data out of the CPU caches. Passing one step's scalars to the
series, the writer and ~20 rules then costs ~180 us on the bench MLP (7 ms a step);
the same work for a batch of steps costs about a third of that a step (the callback's
own time per step, which ``bench/overhead.py`` prints). Holding is only
for collected steps closer together than ``GAP`` (slower steps pay little for the
work, and must reach the panel at once) and for at most ``MAX_AGE``, so the live panel
lags by one refresh at worst. The monitor decides when holding is allowed at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from msmon_nb.metrics.series import SeriesStore
from msmon_nb.sinks.base import Fanout

# (step, wall time, scalars, what runs before they go anywhere: ``Outlet.emit``'s ``first``)
Items = list[tuple[int, float, dict[str, float], Callable[[], Any] | None]]

# collected steps closer together than this are held; the oldest held step waits at most
# MAX_AGE (the panel redraws every 0.25-1 s)
GAP = 0.02
MAX_AGE = 0.05


class EmitBatch:
    """Held ``(step, wall time, scalars)`` in arrival order."""

    __slots__ = ("items", "last", "on", "since")

    def __init__(self) -> None:
        self.on = False
        self.items: Items = []
        self.since = 0.0  # when the oldest held item arrived
        self.last = -float("inf")  # when the last item arrived, held or not

    def hold(
        self,
        step: int,
        wall: float,
        values: Mapping[str, float],
        first: Callable[[], Any] | None = None,
    ) -> bool:
        """While ``on`` (the caller checks it): keep the item for later; False when it
        must be passed on now (the previous item came ``GAP`` or more ago and none is
        waiting)."""
        now = time.perf_counter()
        fast = now - self.last < GAP
        self.last = now
        if not (fast or self.items):
            return False
        if not self.items:
            self.since = now
        self.items.append((step, wall, dict(values), first))
        return True

    def due(self) -> bool:
        """The oldest held item has waited ``MAX_AGE``."""
        return bool(self.items) and time.perf_counter() - self.since >= MAX_AGE

    def take(self) -> Items:
        items, self.items = self.items, []
        return items


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
        # whether judging a step may wait (``monitor.actions.Actions.can_wait``)
        self.can_hold: Callable[[], bool] = lambda: True
        self.batch = EmitBatch()
        self._guard = guard

    def emit(
        self, step: int, values: Mapping[str, float], first: Callable[[], Any] | None = None
    ) -> None:
        """Scalars of ``step`` on their way; while holding (``batch.on``), fast steps'
        scalars wait for their batch, in order. ``first``: work on this step that must
        come before its scalars reach the rules (``Actions.layer_values``' judgement),
        held with them so that a batch's runs together."""
        if not values and first is None:
            return
        wall = time.time()
        batch = self.batch
        if batch.on and batch.hold(step, wall, values, first):
            if batch.due():
                self.release()
            return
        self._pass_on([(step, wall, dict(values), first)])

    def hold(self, on: bool) -> None:
        """Hold the scalars of collected steps that come less than ``GAP`` apart and pass
        them on together once the oldest has waited ``MAX_AGE``, or at a pause, a stop,
        ``flush`` or ``close`` (517 -> 371 us of callback time a step on the bench MLP,
        ``bench/overhead.py --not-held``). Not while an alert would act on the step it
        fires at (``snapshot``, ``stop``, ``debug``, ``skip``, ``break_on``, a flight
        recorder: ``can_hold`` says): then every step is judged as it ends. Off: what
        is held goes on now."""
        self.batch.on = on and self.can_hold()
        self.release(when=not self.batch.on)

    def release(self, when: bool = True) -> None:
        """Pass the held scalars on now (if ``when`` and any are held)."""
        if when and self.batch.items:
            self._pass_on(self.batch.take())

    def _pass_on(self, items: Items) -> None:
        for *_, first in items:
            if first is not None:
                self._guard("judging each layer", first)
        items = [item for item in items if item[2]]
        for step, wall, values, _ in items:
            self.series.add(step, wall, values)
        for step, wall, values, _ in items:
            self.sinks.scalars(step, wall, values)
        if self.observe is not None:
            for step, _, values, _ in items:
                self._guard("diagnosing", self.observe, step, values)
