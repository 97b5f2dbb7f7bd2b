"""Statistics of a tensor beyond its L2 norm: the largest magnitude, how many values are
not finite, how many are exactly zero.

``param_stats``, ``optimizer_state`` (``monitor_config.param_stat_kinds``) and the
activations (``collect.activations``) record them under one naming scheme:
``<what>_<stat>`` / ``<stat>`` with ``stat`` one of ``STAT_KINDS``. The L2 norm alone
says a tensor grew; ``max_abs`` says whether one value or all of them did, ``nonfinite``
says where a NaN first appeared, ``zero_frac`` says a ReLU layer died -- what msprobe's
``TrainerMon`` shows beside the norm.

Every figure is computed on the host in float64 (norm: float64 chunks, ``metrics.norms``),
so it is exact against a float64 reference. Like the norm, ``max_abs`` is NaN where a NaN
is present (a maximum that skipped it would hide it); ``nonfinite`` counts NaN and
+-Inf; ``zero_frac`` is the share of elements equal to 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from msmon_nb.metrics.norms import sum_of_squares

# in the order tags and charts list them; the config names these (``param_stat_kinds``)
STAT_KINDS = ("norm", "max_abs", "nonfinite", "zero_frac")
# activations add the mean (a sign of the layer's output drifting); a parameter's mean
# is mostly noise around 0, so it is not among the parameter kinds
ACT_STATS = ("norm", "max_abs", "mean", "nonfinite", "zero_frac")


def tensor_extent(array: np.ndarray, kinds: Iterable[str]) -> dict[str, float]:
    """``{kind: value}`` for each of ``kinds`` (``STAT_KINDS`` and ``mean``) of
    ``array``, in float64. An empty array gives NaN for every kind but ``nonfinite``."""
    flat = np.asarray(array).reshape(-1)
    if flat.dtype == np.bool_ or not np.issubdtype(flat.dtype, np.number):
        flat = flat.astype(np.float32)
    out: dict[str, float] = {}
    size = int(flat.size)
    for kind in kinds:
        if kind == "norm":
            out[kind] = math.sqrt(sum_of_squares(flat))
        elif kind == "nonfinite":
            out[kind] = float(size - int(np.count_nonzero(np.isfinite(flat))))
        elif not size:
            out[kind] = math.nan
        elif kind == "max_abs":
            out[kind] = float(np.max(np.abs(flat)))  # |x| is exact in any float width
        elif kind == "mean":
            out[kind] = float(np.mean(flat, dtype=np.float64))
        elif kind == "zero_frac":
            out[kind] = float(np.count_nonzero(flat == 0)) / size
        else:
            raise ValueError(f"unknown statistic {kind!r}; known: {', '.join(ACT_STATS)}")
    return out
