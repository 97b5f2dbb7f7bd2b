"""The input pipeline: a run whose steps mostly wait for the next batch (data-bound)."""

from __future__ import annotations

import collections
import statistics
from collections.abc import Mapping
from typing import Any

from msmon_nb.diagnose.base import CardRule, Finding, Streak


class DataBound(CardRule, kind="data_bound"):
    """Steps spend ``share`` or more of their time waiting for data, over ``window`` steps,
    and that wait is real: its median is at least ``min_wait`` seconds a step.

    Fed data_time and compute_time of each collected step (the monitor records both for
    ``Model.train`` and watched loops). Step times are noisy, so the test is on the
    median share of the last ``window`` collected steps; ``since_step`` is the first of
    those steps that was data-bound itself. Clears after ``QUIET`` steps whose median is
    below the share.

    ``min_wait`` keeps the gap between two steps of a loop over in-memory tensors --
    the loop's own Python (``.asnumpy()``, printing, list appends), a fraction of a
    millisecond -- from passing for input waiting on a model that computes in less:
    no input pipeline fix would win that time back.
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self._recent: collections.deque[tuple[int, float, float]] = collections.deque(
            maxlen=self.window
        )
        self._streak = Streak(patience=1)

    @property
    def active(self) -> bool:
        """True while the run is reported data-bound."""
        return self._streak.active

    def update(self, step: int, data_secs: float, compute_secs: float) -> Finding | None:
        """Feed one step's seconds waiting for data and computing."""
        total = data_secs + compute_secs
        if not total > 0:
            return None
        self._recent.append((step, data_secs / total, data_secs))
        if len(self._recent) < self.window:
            return None
        median = statistics.median(f for _, f, _ in self._recent)
        if median < self.share or statistics.median(w for _, _, w in self._recent) < self.min_wait:
            self._streak.miss()
            return None
        if not self._streak.hit(step):
            return None
        since = next(s for s, f, _ in self._recent if f >= self.share)
        waited = data_secs * 1e3
        message = (
            f"data-bound since step {since}: {median:.0%} of step time waiting for data "
            f"(median of the last {self.window} steps; now {waited:.1f} ms of "
            f"{total * 1e3:.1f} ms); speed up the input pipeline: more dataset workers "
            "(num_parallel_workers), prefetching, or preprocessing and caching the data once"
        )
        return Finding(since, median, message)
