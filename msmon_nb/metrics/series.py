"""Bounded in-memory series (the panel's and the rules' view of a live run).

A run of days records millions of steps per tag; the live view must not grow with them
(bench/long.py measured the kernel at +24 bytes per point per tag, ~150 MB over a
million steps of six tags, before this bound). Every point is held until a series
reaches ``limit`` points; then its older half is thinned to min/max buckets
(``metrics.decimate.kept_indices``: extremes, NaN/Inf, first and last kept, so a spike
stays visible) and the newer half stays raw. The run's files keep every point; the
live view keeps the recent steps exactly and the distant ones as their outline.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from msmon_nb.metrics.decimate import kept_indices

LIMIT = 1 << 16  # raw points per tag before thinning: 1.5 MiB of arrays, ~18 h at 1 step/s
THIN_TO = 64  # the older half keeps 1/64 of its points (two per bucket of 128)


class Series:
    """Steps, values and wall times of one tag, in arrays that double up to ``limit``.

    ``n`` is the points held; ``appended`` counts every point ever added, so a reader
    that keeps a cursor (``notebook.updates.PointStream``) finds its place after the
    older points were thinned.
    """

    __slots__ = ("_steps", "_values", "_walls", "appended", "limit", "n")

    def __init__(self, capacity: int = 1024, limit: int = LIMIT) -> None:
        if limit < 2 * THIN_TO:
            raise ValueError(f"limit={limit}: use at least {2 * THIN_TO}, e.g. {LIMIT}")
        self._steps = np.empty(min(capacity, limit), dtype=np.int64)
        self._values = np.empty(min(capacity, limit), dtype=np.float64)
        self._walls = np.empty(min(capacity, limit), dtype=np.float64)
        self.n = 0
        self.appended = 0
        self.limit = limit

    def append(self, step: int, value: float, wall: float) -> None:
        """Add one point."""
        if self.n == len(self._steps):
            self._grow()
        self._steps[self.n] = step
        self._values[self.n] = value
        self._walls[self.n] = wall
        self.n += 1
        self.appended += 1

    def extend(self, steps: np.ndarray, values: np.ndarray, walls: np.ndarray) -> None:
        """Add many points."""
        for lo in range(0, len(steps), self.limit // 2):
            part = slice(lo, lo + self.limit // 2)
            k = len(steps[part])
            while self.n + k > len(self._steps):
                self._grow()
            self._steps[self.n : self.n + k] = steps[part]
            self._values[self.n : self.n + k] = values[part]
            self._walls[self.n : self.n + k] = walls[part]
            self.n += k
            self.appended += k

    def _grow(self) -> None:
        if len(self._steps) >= self.limit:
            self._thin()
            return
        size = min(self.limit, max(1024, 2 * len(self._steps)))
        for name in ("_steps", "_values", "_walls"):
            old = getattr(self, name)
            new = np.empty(size, dtype=old.dtype)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)

    def _thin(self) -> None:
        """Thin the older half in place; the newer half moves down behind it."""
        half = self.n // 2
        keep = kept_indices(self._values[:half], half // THIN_TO)
        rest = self.n - half
        for arr in (self._steps, self._values, self._walls):
            arr[: len(keep)] = arr[keep]
            arr[len(keep) : len(keep) + rest] = arr[half : self.n]
        self.n = len(keep) + rest

    @property
    def steps(self) -> np.ndarray:
        """Steps so far (a view: copy it to keep it)."""
        return self._steps[: self.n]

    @property
    def values(self) -> np.ndarray:
        """Values so far (a view)."""
        return self._values[: self.n]

    @property
    def walls(self) -> np.ndarray:
        """Wall times so far (a view)."""
        return self._walls[: self.n]

    def last(self) -> float | None:
        """The newest value."""
        return float(self._values[self.n - 1]) if self.n else None

    def __len__(self) -> int:
        return self.n


class SeriesStore(Mapping[str, Series]):
    """tag -> Series, with a version number that changes whenever data arrives."""

    def __init__(self) -> None:
        self._series: dict[str, Series] = {}
        self.version = 0

    def add(self, step: int, wall: float, values: Mapping[str, float]) -> None:
        """Record ``values`` (tag -> number) at ``step``."""
        series = self._series
        for tag, value in values.items():
            s = series.get(tag)
            if s is None:
                s = series[tag] = Series()
            s.append(step, value, wall)
        self.version += 1

    def __getitem__(self, tag: str) -> Series:
        return self._series[tag]

    def __iter__(self) -> Iterator[str]:
        return iter(self._series)

    def __len__(self) -> int:
        return len(self._series)
