"""Fixed-size views of long series that keep every spike: min/max per bucket.

Reservoir sampling (TensorBoard, MindInsight: 1,000 random points) drops a one-step
spike with high probability. Here each bucket of consecutive points contributes its
minimum and its maximum, at their own steps, so the drawn line passes through every
extreme. ``Decimator`` does this incrementally: each call folds in only the points
added since the previous call, so a redraw costs O(new points + buckets), not O(n).
Non-finite values are kept apart (``nonfinite_steps``) so they can be marked rather
than silently dropped.
"""

from __future__ import annotations

import numpy as np


def minmax_decimate(
    steps: np.ndarray, values: np.ndarray, max_points: int
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points (rounded down to even) keeping each bucket's min and max.

    Non-finite values are ignored for the envelope; a bucket with no finite value
    contributes nothing.
    """
    n = len(values)
    if n <= max_points:
        return steps, values
    buckets = max(1, max_points // 2)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    finite = np.isfinite(values)
    lo = np.where(finite, values, np.inf)
    hi = np.where(finite, values, -np.inf)
    starts = edges[:-1]
    mins = np.minimum.reduceat(lo, starts)
    maxs = np.maximum.reduceat(hi, starts)
    # index of the min/max inside each bucket: first position equal to the reduced value
    bucket_of = np.repeat(np.arange(buckets), np.diff(edges))
    is_min = lo == mins[bucket_of]
    is_max = hi == maxs[bucket_of]
    idx = np.arange(n)
    first_min = _first_index(bucket_of, is_min, buckets, idx)
    first_max = _first_index(bucket_of, is_max, buckets, idx)
    keep = np.isfinite(mins)
    pick = np.unique(np.concatenate([first_min[keep], first_max[keep]]))
    return steps[pick], values[pick]


def _first_index(bucket_of: np.ndarray, mask: np.ndarray, buckets: int, idx: np.ndarray):
    out = np.full(buckets, -1, dtype=np.int64)
    hits = idx[mask]
    owners = bucket_of[mask]
    # reversed assignment leaves the first hit of each bucket in place
    out[owners[::-1]] = hits[::-1]
    return out


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
