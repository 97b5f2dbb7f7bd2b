"""Scalars of fast collected steps, held back and passed on together (``Monitor.hold_emits``).

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
from collections.abc import Mapping

# collected steps closer together than this are held; the oldest held step waits at most
# MAX_AGE (the panel redraws every 0.25-1 s)
GAP = 0.02
MAX_AGE = 0.05


class EmitBatch:
    """Held ``(step, wall time, scalars)`` in arrival order."""

    __slots__ = ("items", "last", "on", "since")

    def __init__(self) -> None:
        self.on = False
        self.items: list[tuple[int, float, dict[str, float]]] = []
        self.since = 0.0  # when the oldest held item arrived
        self.last = -float("inf")  # when the last item arrived, held or not

    def hold(self, step: int, wall: float, values: Mapping[str, float]) -> bool:
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
        self.items.append((step, wall, dict(values)))
        return True

    def due(self) -> bool:
        """The oldest held item has waited ``MAX_AGE``."""
        return bool(self.items) and time.perf_counter() - self.since >= MAX_AGE

    def take(self) -> list[tuple[int, float, dict[str, float]]]:
        items, self.items = self.items, []
        return items
