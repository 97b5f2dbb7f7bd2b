"""Growable in-memory series (the panel's and the rules' view of a live run)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np


class Series:
    """Steps, values and wall times of one tag, in arrays that double when full."""

    __slots__ = ("_steps", "_values", "_walls", "n")

    def __init__(self, capacity: int = 1024) -> None:
        self._steps = np.empty(capacity, dtype=np.int64)
        self._values = np.empty(capacity, dtype=np.float64)
        self._walls = np.empty(capacity, dtype=np.float64)
        self.n = 0

    def append(self, step: int, value: float, wall: float) -> None:
        """Add one point."""
        if self.n == len(self._steps):
            self._grow()
        self._steps[self.n] = step
        self._values[self.n] = value
        self._walls[self.n] = wall
        self.n += 1

    def extend(self, steps: np.ndarray, values: np.ndarray, walls: np.ndarray) -> None:
        """Add many points."""
        k = len(steps)
        while self.n + k > len(self._steps):
            self._grow()
        self._steps[self.n : self.n + k] = steps
        self._values[self.n : self.n + k] = values
        self._walls[self.n : self.n + k] = walls
        self.n += k

    def _grow(self) -> None:
        size = max(1024, 2 * len(self._steps))
        for name in ("_steps", "_values", "_walls"):
            old = getattr(self, name)
            new = np.empty(size, dtype=old.dtype)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)

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
