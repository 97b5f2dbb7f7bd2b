"""Series of one tag merged across a run's ranks: one model for the viewer and ``Run``.

The band of a multi-rank run is computed here for ``Run.merged`` (the follow panel,
scripts) and the viewer alike.

``mean`` is non-finite where any rank's value is; ``min``/``max`` are over finite values
only, so one rank's NaN does not erase the band. ``merge_ranks`` folds the ranks one at a
time into per-step accumulators over the union of their steps, so merging never holds all
ranks' points side by side; ``merge_blocks`` merges the ranks' overview rows (the viewer's
cold path for large done ranks).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from typing import Any, NamedTuple

import numpy as np


class Merged(NamedTuple):
    """One tag across ranks, per step any rank recorded.

    ``mean`` is non-finite where a rank's value is (NaN wins, as in the ranks' own
    charts); ``min`` and ``max`` are over the finite values only (NaN where none is), so
    one rank's NaN does not erase the band; ``count`` is how many ranks recorded the step.
    """

    steps: np.ndarray  # int64
    mean: np.ndarray  # float64
    min: np.ndarray  # float64
    max: np.ndarray  # float64
    count: np.ndarray  # int32
    median: np.ndarray | None = None  # float64, of the ranks' values (aligned ranks only)
    outliers: dict[int, np.ndarray] | None = None  # rank -> its values at ``steps``
    exact: bool = True  # False when merged from overview blocks


OUTLIER_Z = 4.0  # a rank whose 90th-percentile robust z against the others exceeds this
MAX_OUTLIERS = 8  # ... is drawn as its own line beside the band; at most this many


def median_and_outliers(
    ranks: list[int], table: np.ndarray
) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """The median across ranks per column of ``table`` (ranks x points) and the ranks
    far from it: robust z = |value - median| / (1.4826 MAD), its 90th percentile over the
    points above ``OUTLIER_Z`` (a rank off for a tenth of the run or more), worst first."""
    with np.errstate(invalid="ignore"):
        median = np.nanmedian(table, axis=0) if len(ranks) > 1 else table[0].astype(np.float64)
        if len(ranks) < 3:
            return median, {}
        dev = np.abs(table - median)
        mad = np.nanmedian(dev, axis=0) * 1.4826
        scale = np.maximum(mad, 1e-6 * np.abs(median) + 1e-12)
        z = dev / scale
        score = np.nanpercentile(np.where(np.isfinite(z), z, np.nan), 90, axis=1)
    order = [i for i in np.argsort(-np.nan_to_num(score, nan=-1.0)) if score[i] > OUTLIER_Z]
    return median, {ranks[i]: table[i].astype(np.float64) for i in order[:MAX_OUTLIERS]}


def merge_blocks(ranks: list[int], blocks: list[np.ndarray]) -> Merged | None:
    """The ranks' overview rows of one tag merged block by block, or None when their
    blocks do not line up (ranks that recorded different steps: decode instead).

    Per block: the mean of every rank's finite values (NaN when any rank had a NaN/Inf
    there), the lowest minimum and highest maximum (a one-step spike on one rank stays in
    the band), the ranks present, the median of the ranks' block means and the outlier
    ranks. Each block stands at its last step; the first block also at its first step.
    """
    first = blocks[0]
    if any(
        len(b) != len(first)
        or not np.array_equal(b["first_step"], first["first_step"])
        or not np.array_equal(b["last_step"], first["last_step"])
        for b in blocks[1:]
    ):
        return None
    if not len(first):
        return None
    sums = np.stack([b["sum"] for b in blocks])
    finite = np.stack([b["finite"] for b in blocks]).astype(np.float64)
    bad = np.stack([b["nonfinite"] for b in blocks]).sum(axis=0) > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / finite  # rank x block; NaN where a rank had no finite value
        mean = sums.sum(axis=0) / finite.sum(axis=0)
    mean[bad] = np.nan
    low = np.stack([b["min"] for b in blocks]).min(axis=0)
    high = np.stack([b["max"] for b in blocks]).max(axis=0)
    low[np.isinf(low)] = np.nan
    high[np.isinf(high)] = np.nan
    median, outliers = median_and_outliers(ranks, means)
    # each block at its last step, and the first block at its first step too
    idx = np.concatenate([[0], np.arange(len(first))])
    steps = np.concatenate([first["first_step"][:1], first["last_step"]])
    if len(steps) > 1 and steps[0] == steps[1]:
        idx, steps = idx[1:], steps[1:]
    count = np.full(len(idx), len(blocks), dtype=np.int32)
    return Merged(
        steps.astype(np.int64), mean[idx], low[idx], high[idx], count, median[idx],
        {r: v[idx] for r, v in outliers.items()}, exact=False,
    )  # fmt: skip


def merge_ranks(parts: Iterable[Any], ranks: list[int] | None = None) -> Merged:
    """Merge series (anything with sorted, unique ``steps`` and ``values``) across ranks;
    with ``ranks`` (the rank of each part) and parts on the same steps, also the median
    across ranks and the outlier ranks."""
    parts = list(parts)
    if not parts:
        raise ValueError("merge_ranks needs at least one series")
    steps = np.asarray(parts[0].steps, dtype=np.int64)
    aligned = all(p.steps is steps or np.array_equal(p.steps, steps) for p in parts[1:])
    if not aligned:
        steps = reduce(np.union1d, (np.asarray(p.steps, dtype=np.int64) for p in parts))
    n = len(steps)
    total = np.zeros(n)
    low = np.full(n, np.inf)
    high = np.full(n, -np.inf)
    count = np.zeros(n, dtype=np.int32)
    for part in parts:
        at = slice(None) if aligned else np.searchsorted(steps, part.steps)
        values = np.asarray(part.values, dtype=np.float64)
        finite = np.isfinite(values)
        total[at] += values
        low[at] = np.minimum(low[at], np.where(finite, values, np.inf))
        high[at] = np.maximum(high[at], np.where(finite, values, -np.inf))
        count[at] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
    low[np.isinf(low)] = np.nan
    high[np.isinf(high)] = np.nan
    median = outliers = None
    if aligned and ranks is not None:
        table = np.stack([np.asarray(p.values, dtype=np.float32) for p in parts])
        table = np.where(np.isfinite(table), table, np.nan)
        median, outliers = median_and_outliers(ranks, table)
    return Merged(steps, mean, low, high, count, median, outliers)
