"""Min/max-per-bucket downsampling of one scalar series, NaN/Inf kept.

A chart needs a few hundred points, a run may have millions. Reservoir sampling (what
MindInsight and TensorBoard serve) drops a one-step spike with high probability, which is
the very step a user is looking for. Here the series is cut into equal-count buckets and
each bucket contributes its minimum and its maximum point, in step order, so any single
extreme survives and the line keeps its envelope; the first and last points are always
kept, so the chart starts at step 0 (MindInsight's sample may begin dozens of steps
later). Non-finite values (NaN, +Inf, -Inf) are never averaged away either: each bucket
that holds one contributes its first NaN and its first infinity, so the page can mark
them.

``downsample_band`` does the same for a run's ranks merged: the mean line is reduced by
the same rule, and each point it keeps carries the min of the ranks' minima and the max
of their maxima over its bucket, so a spike on any one rank stays in the band.

Everything is vectorised numpy: 1 M points take a few milliseconds.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

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
