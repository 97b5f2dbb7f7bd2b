"""Running robust statistics over the last N values, cheap enough to update every step.

A sorted copy of the window is kept next to the arrival order, so the median and any
quantile are O(1) reads and an update is two binary searches plus a short memmove (a
64-value window costs well under a microsecond). The MAD needs a pass over the window;
it is recomputed at most every ``refresh`` additions and only when asked for, because
the rules need it only when a value already looks suspicious.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution is 0.6745 sigma


class RollingWindow:
    """The last ``size`` values: median, quantiles and MAD without rescanning history."""

    __slots__ = ("_fifo", "_mad", "_sorted", "_stale", "refresh", "size")

    def __init__(self, size: int, refresh: int = 8) -> None:
        self.size = size
        self.refresh = refresh
        self._fifo: deque[float] = deque()
        self._sorted: list[float] = []
        self._mad = 0.0
        self._stale = refresh  # no MAD computed yet

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, value: float) -> None:
        """Append ``value``; the oldest value leaves once the window is full."""
        ordered = self._sorted
        if len(ordered) == self.size:
            del ordered[bisect_left(ordered, self._fifo.popleft())]
        self._fifo.append(value)
        insort(ordered, value)
        self._stale += 1

    def median(self) -> float:
        """Median of the window (mean of the two middle values when the count is even)."""
        ordered = self._sorted
        n = len(ordered)
        half = n >> 1
        return ordered[half] if n & 1 else 0.5 * (ordered[half - 1] + ordered[half])

    def quantile(self, q: float) -> float:
        """The ``q`` quantile with linear interpolation (numpy's default method)."""
        ordered = self._sorted
        pos = q * (len(ordered) - 1)
        lo = int(pos)
        frac = pos - lo
        if frac == 0.0:
            return ordered[lo]
        return ordered[lo] + (ordered[lo + 1] - ordered[lo]) * frac

    def mad(self) -> float:
        """Median absolute deviation from the median, at most ``refresh`` additions old."""
        if self._stale >= self.refresh:
            med = self.median()
            devs = sorted([abs(v - med) for v in self._sorted])
            n = len(devs)
            half = n >> 1
            self._mad = devs[half] if n & 1 else 0.5 * (devs[half - 1] + devs[half])
            self._stale = 0
        return self._mad

    def sigma(self) -> float:
        """Robust standard deviation: 1.4826 x MAD."""
        return MAD_TO_SIGMA * self.mad()

    def values(self) -> list[float]:
        """The window in arrival order (a copy)."""
        return list(self._fifo)


class Levels:
    """The running level of one series, shared by every rule that reads it.

    ``observe(step, value)`` is idempotent per (step, value): the first rule to see a
    value records the window's median (and q90) *before* it and then adds it; the next
    rules at the same step read the same numbers. This halves the per-step cost when
    two rules (spike and divergence, explosion and vanishing) watch one series.

    With ``log=True`` the window holds log10 of the values; a value <= 0 has no log and
    is not added (``x`` is None then).
    """

    __slots__ = ("_step", "_value", "log", "median", "n", "q90", "upper", "win", "x")

    def __init__(self, size: int, log: bool = False, upper: bool = False) -> None:
        self.win = RollingWindow(size)
        self.log = log
        self.upper = upper
        self.n = 0  # values in the window before the current one
        self.median = 0.0
        self.q90 = 0.0
        self.x: float | None = None
        self._step: int | None = None
        self._value = 0.0

    def observe(self, step: int, value: float) -> None:
        """Take ``value`` (once per step) and expose the level it is judged against."""
        if step == self._step and value == self._value:
            return
        self._step = step
        self._value = value
        # RollingWindow's add/median/quantile inlined: this runs for every watched series
        # on every collected step, and the method calls were a third of its cost
        win = self.win
        ordered = win._sorted
        n = self.n = len(ordered)
        if self.log:
            if value <= 0.0:
                self.x = None
                if n:
                    self.median = win.median()
                return
            x = math.log10(value)
        else:
            x = value
        self.x = x
        if n:
            half = n >> 1
            self.median = ordered[half] if n & 1 else 0.5 * (ordered[half - 1] + ordered[half])
            if self.upper:
                pos = 0.9 * (n - 1)
                lo = int(pos)
                frac = pos - lo
                low = ordered[lo]
                self.q90 = low + (ordered[lo + 1] - low) * frac if frac else low
        if n == win.size:
            del ordered[bisect_left(ordered, win._fifo.popleft())]
        win._fifo.append(x)
        insort(ordered, x)
        win._stale += 1

    def sigma(self) -> float:
        """Robust sigma (1.4826 x MAD) of the window, current value included."""
        return self.win.sigma()
