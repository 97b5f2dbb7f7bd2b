"""Histograms in MindSpore's bucket layout (``_summary_adapter._fill_histogram_summary``).

The layout is part of the file format: MindInsight draws whatever buckets it finds, so we
build them exactly as MindSpore does (bin count from the number of finite values, equal
widths over [min, max] in the tensor's dtype), and tests compare with MindSpore's own code.
"""

from __future__ import annotations

import numpy as np

from msmon_nb.events.wire import Histogram

MAX_BINS = 90
_MAX_PER_BIN = 10


def bin_count(valid: int) -> int:
    """MindSpore's bin count for ``valid`` finite values: about ten values a bin, at most 90."""
    if not valid:
        return 1
    if valid <= 5:
        return 2
    if valid <= 10:
        return 3
    if valid <= 880:
        return valid // _MAX_PER_BIN + 1
    return MAX_BINS


def histogram(values: np.ndarray) -> Histogram:
    """Histogram of ``values`` (any shape), NaN/Inf counted apart from the buckets."""
    arr = np.asarray(values)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    flat = arr.reshape(-1)
    total = int(flat.size)
    if np.issubdtype(flat.dtype, np.floating):
        finite = np.isfinite(flat)
        nan = int(np.count_nonzero(np.isnan(flat)))
        pos_inf = int(np.count_nonzero(np.isposinf(flat)))
        neg_inf = int(np.count_nonzero(np.isneginf(flat)))
        valid = total - nan - pos_inf - neg_inf
    else:
        finite = None
        nan = pos_inf = neg_inf = 0
        valid = total
    if not valid:
        return Histogram(
            buckets=(),
            nan_count=nan,
            pos_inf_count=pos_inf,
            neg_inf_count=neg_inf,
            count=total,
        )
    if finite is None:
        good = flat
        total_sum = float(flat.sum(dtype=np.float64))
    else:
        good = flat[finite]
        # filled(0).sum, as numpy.ma does, so the float64 sum matches MindSpore's bit for bit
        total_sum = float(np.where(finite, flat, 0).sum(dtype=np.float64))
    lo = float(good.min())
    hi = float(good.max())
    first, last = lo, hi
    if not first < last:
        first -= 0.5
        last += 0.5
    edges = np.linspace(first, last, bin_count(valid) + 1, dtype=flat.dtype)
    counts, edges = np.histogram(good, bins=edges)
    widths = edges[1:] - edges[:-1]
    buckets = tuple(
        (float(left), float(width), int(count))
        for left, width, count in zip(edges[:-1], widths, counts, strict=True)
    )
    return Histogram(
        buckets=buckets,
        nan_count=nan,
        pos_inf_count=pos_inf,
        neg_inf_count=neg_inf,
        min=lo,
        max=hi,
        sum=total_sum,
        count=total,
    )
