"""What every rule shares: the ``Finding`` a rule returns and the conventions it follows.

A rule is a small object with ``update(step, value) -> Finding | None`` and an
``active`` flag. It sees one tag's finite values in arrival order (the engine keeps NaN
and Inf away from every rule but ``nonfinite``), keeps O(1)-sized state, touches no
clock, file or global, and returns a ``Finding`` only when an anomaly *starts*; while
``active`` is set it stays quiet, and it clears ``active`` by its own hysteresis (for
most rules: ``QUIET`` normal steps in a row) so a value hovering at a threshold, or a
run flapping between Inf and finite values, is one report, not many.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

LOG2 = math.log10(2.0)  # values within 2x of the running median are never "out of band"
TINY = 1e-12  # keeps thresholds above a perfectly constant series
# An anomaly clears after this many collected steps in a row without it: a diverging
# loss alternates Inf and finite values, an exploding grad_norm dips back into its band
# now and then, and each of those is one episode, not many.
QUIET = 10


class Finding(NamedTuple):
    """A rule's raw result; the engine turns it into an ``Alert``."""

    since_step: int
    value: float | None
    message: str


class Streak:
    """An episode of a condition: ``patience`` hits in a row start it (reported once),
    ``QUIET`` misses in a row end it. ``since`` is the first hit of the run of hits."""

    __slots__ = ("_calm", "active", "count", "patience", "since")

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.count = 0
        self.since = 0
        self._calm = 0
        self.active = False

    def miss(self) -> None:
        """The condition does not hold at this step."""
        self.count = 0
        if self.active:
            self._calm += 1
            if self._calm >= QUIET:
                self.active = False

    def hit(self, step: int) -> bool:
        """The condition holds at ``step``; True when this confirms a new episode."""
        self._calm = 0
        if self.count == 0:
            self.since = step
        self.count += 1
        if self.active or self.count < self.patience:
            return False
        self.active = True
        return True


class SeriesRule(Protocol):
    """The interface of the rules bound to one tag."""

    active: bool

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the next value of the series; a ``Finding`` when an anomaly starts."""
        ...


def short(tag: str) -> str:
    """'train/grad_norm' -> 'grad_norm': messages name the quantity, not the group."""
    return tag.rsplit("/", 1)[-1]
