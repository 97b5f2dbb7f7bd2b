"""Fixed-size views of long series that keep every spike: the one decimation of msmon_nb.

Reservoir sampling (TensorBoard, MindInsight: 1,000 random points) drops a one-step
spike with high probability. Here each bucket of consecutive points contributes its
minimum and its maximum, at their own steps, so the drawn line passes through every
extreme; the first and last points are always kept (the chart starts at step 0 and ends
at the newest step); non-finite values (NaN, +Inf, -Inf) are never averaged away: each
bucket that holds one contributes its first NaN and its first infinity, so pages can
mark them. ``downsample`` is that rule for a whole series: the viewer's API and the
panel's stream (its resets and large appends) use it. ``downsample_band`` does the same
for a run's ranks merged: the centre line by the same rule, each kept point carrying the
min of the ranks' minima and the max of their maxima over its bucket, so a spike on any
one rank stays in the band. ``Decimator`` is the incremental form for the matplotlib
pictures (each call folds in only the points added since the previous one). ``ema`` is
the smoothing every page shows (``chart.js``'s ``ema`` is tested against it).

Everything is vectorised numpy: 1 M points take a few milliseconds.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard-style debiased exponential moving average (NaN/Inf passed through)."""
    out = np.empty(len(values), dtype=np.float64)
    last = 0.0
    count = 0
    for i, v in enumerate(values.tolist()):
        if not np.isfinite(v):
            out[i] = v
            continue
        last = last * weight + (1 - weight) * v
        count += 1
        out[i] = last / (1 - weight**count) if weight < 1 else v
    return out


_FIELDS = ("min_step", "min", "max_step", "max", "sum", "count", "first", "last")


class Decimator:
    """Incremental min/max decimation of one growing series (see module docstring).

    Complete buckets of ``block`` points are kept as columns of numpy arrays; when there
    would be more than ``max_buckets`` of them, neighbours are merged pairwise and the
    block doubles. Points past the last complete bucket (fewer than ``block``) are drawn
    raw.
    """

    def __init__(self, max_buckets: int = 500) -> None:
        self.max_buckets = max_buckets
        self.block = 1  # points per complete bucket
        self.done = 0  # points folded into complete buckets
        self.b = {name: np.zeros(0) for name in _FIELDS}
        self.nonfinite_steps: list[int] = []
        self._scanned = 0  # points checked for non-finite values

    def __len__(self) -> int:
        return len(self.b["min"])

    def update(self, steps: np.ndarray, values: np.ndarray) -> None:
        """Fold in the points of ``steps``/``values`` beyond those already seen."""
        n = len(values)
        if n > self._scanned:
            fresh = values[self._scanned : n]
            bad = np.nonzero(~np.isfinite(fresh))[0]
            if bad.size:
                self.nonfinite_steps.extend(steps[self._scanned + bad].tolist())
            self._scanned = n
        while n // self.block > self.max_buckets:
            self._merge()
        full = (n - self.done) // self.block
        if full:
            self._append_blocks(steps, values, full)

    def _append_blocks(self, steps: np.ndarray, values: np.ndarray, count: int) -> None:
        b = self.block
        end = self.done + count * b
        vals = np.asarray(values[self.done : end], dtype=np.float64).reshape(count, b)
        stp = np.asarray(steps[self.done : end]).reshape(count, b)
        finite = np.isfinite(vals)
        lo = np.where(finite, vals, np.inf)
        hi = np.where(finite, vals, -np.inf)
        rows = np.arange(count)
        amin = lo.argmin(axis=1)
        amax = hi.argmax(axis=1)
        new = {
            "min_step": stp[rows, amin],
            "min": lo[rows, amin],
            "max_step": stp[rows, amax],
            "max": hi[rows, amax],
            "sum": np.where(finite, vals, 0.0).sum(axis=1),
            "count": finite.sum(axis=1),
            "first": stp[:, 0],
            "last": stp[:, -1],
        }
        for name in _FIELDS:
            self.b[name] = np.concatenate([self.b[name], new[name].astype(np.float64)])
        self.done = end

    def _merge(self) -> None:
        k = len(self) // 2
        if len(self) % 2:  # an odd last bucket goes back to the unfolded tail
            self.done -= self.block
        b = {name: arr[: 2 * k].reshape(k, 2) for name, arr in self.b.items()}
        left_min = b["min"][:, 0] <= b["min"][:, 1]
        left_max = b["max"][:, 0] >= b["max"][:, 1]
        self.b = {
            "min_step": np.where(left_min, b["min_step"][:, 0], b["min_step"][:, 1]),
            "min": np.where(left_min, b["min"][:, 0], b["min"][:, 1]),
            "max_step": np.where(left_max, b["max_step"][:, 0], b["max_step"][:, 1]),
            "max": np.where(left_max, b["max"][:, 0], b["max"][:, 1]),
            "sum": b["sum"].sum(axis=1),
            "count": b["count"].sum(axis=1),
            "first": b["first"][:, 0],
            "last": b["last"][:, 1],
        }
        self.block *= 2

    def _tail(self, steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tail_s = np.asarray(steps[self.done :], dtype=np.float64)
        tail_v = np.asarray(values[self.done :], dtype=np.float64)
        ok = np.isfinite(tail_v)
        return tail_s[ok], tail_v[ok]

    def points(self, steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The decimated line: each bucket's min and max in step order, then the raw tail."""
        b = self.b
        keep = np.isfinite(b["min"])
        min_first = b["min_step"] <= b["max_step"]
        s1 = np.where(min_first, b["min_step"], b["max_step"])[keep]
        v1 = np.where(min_first, b["min"], b["max"])[keep]
        s2 = np.where(min_first, b["max_step"], b["min_step"])[keep]
        v2 = np.where(min_first, b["max"], b["min"])[keep]
        xs = np.column_stack([s1, s2]).reshape(-1)
        ys = np.column_stack([v1, v2]).reshape(-1)
        tail_s, tail_v = self._tail(steps, values)
        return np.concatenate([xs, tail_s]), np.concatenate([ys, tail_v])

    def means(self, steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One mean per bucket (at the bucket's middle step) plus the raw tail: for smoothing."""
        b = self.b
        has = b["count"] > 0
        xs = ((b["first"] + b["last"]) / 2)[has]
        ys = b["sum"][has] / b["count"][has]
        tail_s, tail_v = self._tail(steps, values)
        return np.concatenate([xs, tail_s]), np.concatenate([ys, tail_v])


NAN, POS_INF, NEG_INF = "nan", "inf", "-inf"


class Sampled(NamedTuple):
    """Points chosen for a chart (sorted by step) and what they stand for."""

    steps: np.ndarray  # int64
    values: np.ndarray  # float64, NaN/Inf where the point is non-finite
    raw: bool  # True when every point of the range is here
    count: int  # points in the requested range before downsampling


def select_range(
    steps: np.ndarray, values: np.ndarray, start: int | None, end: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """The points with ``start <= step <= end`` (``steps`` sorted; None = open end)."""
    cut = range_slice(steps, start, end)
    return steps[cut], values[cut]


def range_slice(steps: np.ndarray, start: int | None, end: int | None) -> slice:
    """The slice of sorted ``steps`` with ``start <= step <= end`` (None = open end)."""
    lo = 0 if start is None else int(np.searchsorted(steps, start, side="left"))
    hi = len(steps) if end is None else int(np.searchsorted(steps, end, side="right"))
    return slice(lo, hi)


def downsample(steps: np.ndarray, values: np.ndarray, max_points: int) -> Sampled:
    """At most ``max_points`` finite points, plus at most ``max_points`` non-finite ones.

    Returns the input unchanged (``raw=True``) when it already fits. Otherwise there are
    ``(max_points - 2) // 2`` buckets of equal point count; each gives its min and max
    finite point, its first NaN and its first infinity, and the first and last point of
    the range are always kept, so the result never exceeds 2 x ``max_points`` points (and
    is at most ``max_points`` for a finite series).
    """
    if max_points < 2:
        raise ValueError(f"max_points={max_points}: use at least 2, e.g. max_points=1000")
    n = len(steps)
    values = np.asarray(values, dtype=np.float64)
    if n <= max_points:
        return Sampled(np.asarray(steps, dtype=np.int64), values, True, n)
    chosen, _ = _choose(values, max_points)
    return Sampled(np.asarray(steps[chosen], dtype=np.int64), values[chosen], False, n)


def kept_indices(values: np.ndarray, max_points: int) -> np.ndarray:
    """The indices ``downsample`` keeps of ``values`` (all of them when they fit): for
    callers that thin several arrays aligned with ``values`` (steps, wall times) alike."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) <= max_points:
        return np.arange(len(values))
    return _choose(values, max_points)[0]


class SampledBand(NamedTuple):
    """Points chosen for a band chart: a centre line and, per point, its bucket's extent."""

    steps: np.ndarray  # int64
    values: np.ndarray  # float64: the centre line (e.g. the mean across ranks)
    low: np.ndarray  # float64: lowest ``low`` of the bucket the point stands for (NaN: none)
    high: np.ndarray  # float64: highest ``high`` of that bucket
    count: np.ndarray  # int: fewest ``count`` in that bucket (e.g. ranks present)
    raw: bool
    n: int  # points in the requested range before downsampling


def downsample_band(
    steps: np.ndarray,
    values: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    count: np.ndarray,
    max_points: int,
) -> SampledBand:
    """``downsample`` of the centre line ``values``, with the band's extremes kept.

    The centre line keeps each bucket's min and max points (its spikes survive); each
    chosen point carries the min of ``low`` and the max of ``high`` over its bucket (the
    min of the ranks' minima, the max of their maxima), so one rank's one-step spike
    stays in the band however far the series is reduced. NaN in ``low``/``high`` means
    no value there and is skipped.
    """
    if max_points < 2:
        raise ValueError(f"max_points={max_points}: use at least 2, e.g. max_points=1000")
    n = len(steps)
    values = np.asarray(values, dtype=np.float64)
    low = np.asarray(low, dtype=np.float64)
    high = np.asarray(high, dtype=np.float64)
    if n <= max_points:
        return SampledBand(
            np.asarray(steps, dtype=np.int64), values, low, high, np.asarray(count), True, n
        )
    chosen, size = _choose(values, max_points)
    used = -(-n // size)
    pad = used * size - n
    lows = _buckets(np.where(np.isnan(low), np.inf, low), pad, np.inf, used, size).min(axis=1)
    highs = _buckets(np.where(np.isnan(high), -np.inf, high), pad, -np.inf, used, size)
    highs = highs.max(axis=1)
    big = np.iinfo(np.int64).max
    counts = _buckets(np.asarray(count, dtype=np.int64), pad, big, used, size).min(axis=1)
    lows[np.isposinf(lows)] = np.nan
    highs[np.isneginf(highs)] = np.nan
    bucket = chosen // size
    return SampledBand(
        np.asarray(steps[chosen], dtype=np.int64),
        values[chosen],
        lows[bucket],
        highs[bucket],
        counts[bucket],
        False,
        n,
    )


def _choose(values: np.ndarray, max_points: int) -> tuple[np.ndarray, int]:
    """Indices ``downsample`` keeps of ``values`` (longer than ``max_points``), bucket size."""
    n = len(values)
    buckets = max(1, (max_points - 2) // 2)
    size = -(-n // buckets)  # ceil: every bucket but the last holds exactly `size` points
    used = -(-n // size)
    pad = used * size - n
    finite = np.isfinite(values)
    low = _buckets(np.where(finite, values, np.inf), pad, np.inf, used, size)
    high = _buckets(np.where(finite, values, -np.inf), pad, -np.inf, used, size)
    offsets = np.arange(used) * size
    has_finite = np.isfinite(low.min(axis=1))
    parts = [
        np.array([0, n - 1]),  # the chart spans the whole range, first step included
        (offsets + low.argmin(axis=1))[has_finite],
        (offsets + high.argmax(axis=1))[has_finite],
    ]
    for bad in (np.isnan(values), np.isinf(values)):
        bad = _buckets(bad, pad, False, used, size)
        parts.append((offsets + bad.argmax(axis=1))[bad.any(axis=1)])
    chosen = np.unique(np.concatenate(parts))  # sorted; a bucket whose min is its max: 1 point
    return chosen, size


def _buckets(arr: np.ndarray, pad: int, fill, used: int, size: int) -> np.ndarray:
    """``arr`` padded with ``fill`` to ``used * size`` and shaped (used, size)."""
    if pad:
        arr = np.concatenate([arr, np.full(pad, fill, dtype=arr.dtype)])
    return arr.reshape(used, size)


def nonfinite_kinds(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Indices of non-finite ``values`` and their kind: ``nan``, ``inf`` or ``-inf``."""
    idx = np.flatnonzero(~np.isfinite(values))
    picked = values[idx]
    kinds = [NAN if np.isnan(v) else (POS_INF if v > 0 else NEG_INF) for v in picked.tolist()]
    return idx, kinds
