"""``overhead_budget``: widen the collection interval when collecting costs too much.

A collected step costs the monitor real time (values to the host, norms, ``param_stats``
of every parameter, records written, rules run); the steps in between cost almost
nothing. What training loses is that cost spread over the interval: ``cost /
(interval x step time)``. When the median of the last few collected steps' cost
exceeds ``budget`` of that, the interval doubles -- from the user's own setting up,
never below it -- and keeps doubling at later checks while it is still over.

Medians over a short window, after a warm-up, because single collected steps are noisy
(a first-time compile of the device norm, a page fault, a rule's periodic refit): one
slow step must not change what the user sees. The Monitor measures the cost as its
thread's CPU time, so a core taken by another process does not count as ours, and
starts it after reading the loss: that read waits for the step's own device work
(MindSpore spins while it waits, which a CPU clock would charge to us).
"""

from __future__ import annotations

import statistics
from collections import deque

WARMUP = 2  # first collected steps ignored (compiles, first touches)
WINDOW = 5  # collected steps whose median cost decides


class OverheadBudget:
    """Decides, one collected step at a time, whether the interval must widen."""

    def __init__(self, budget: float, warmup: int = WARMUP, window: int = WINDOW) -> None:
        self.budget = budget
        self.warmup = warmup
        self._seen = 0
        self._costs: deque[float] = deque(maxlen=window)
        self._steps: deque[float] = deque(maxlen=window)
        self.last_share: float | None = None  # cost share that triggered the last widening

    def reset(self) -> None:
        """Start measuring afresh (the interval changed: old shares no longer apply)."""
        self._costs.clear()
        self._steps.clear()

    def observe(self, cost: float, step_time: float | None, interval: int) -> int | None:
        """Feed one collected step: its monitoring ``cost`` and the training ``step_time``
        (seconds per step since the previous collected step). Returns the new, doubled
        interval when the median share is over budget, else None."""
        self._seen += 1
        if self._seen <= self.warmup or step_time is None or step_time <= 0:
            return None
        self._costs.append(cost)
        self._steps.append(step_time)
        if len(self._costs) < (self._costs.maxlen or 1):
            return None
        share = statistics.median(self._costs) / (interval * statistics.median(self._steps))
        if share <= self.budget:
            return None
        self.last_share = share
        self.reset()
        return interval * 2


def widening_message(share: float, budget: float, step: int, before: int, wider: int) -> str:
    """What the user is told (once, and as an ``overhead_budget`` alert) when the
    interval first widens: the measured share, the budget, and how to set a new floor."""
    return (
        f"collecting costs {share:.1%} of training time (overhead_budget {budget:.1%}), so "
        f"from step {step} on it collects every {wider} steps instead of every {before} (it "
        "widens again if still over; mon.set_collect_freq(n) sets a new floor)"
    )
