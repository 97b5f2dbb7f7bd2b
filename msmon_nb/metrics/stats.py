"""Summary statistics of a tensor, NaN/Inf counted apart (the step-level tensor summary)."""

from __future__ import annotations

import math

import numpy as np

STAT_NAMES = ("min", "max", "mean", "std", "norm", "nan_count", "inf_count", "zero_fraction")


def tensor_stats(array: np.ndarray) -> dict[str, float]:
    """min, max, mean, std and L2 norm over finite values; NaN/Inf counts; share of zeros.

    Computed in float64 so the figures equal numpy's own on the same values; with no
    finite value the moments are NaN.
    """
    arr = np.asarray(array)
    flat = arr.reshape(-1)
    if flat.dtype == np.bool_:
        flat = flat.astype(np.uint8)
    if np.issubdtype(flat.dtype, np.floating) or np.issubdtype(flat.dtype, np.complexfloating):
        nan = int(np.count_nonzero(np.isnan(flat)))
        inf = int(np.count_nonzero(np.isinf(flat)))
        finite = flat[np.isfinite(flat)] if nan or inf else flat
    else:
        nan = inf = 0
        finite = flat
    total = int(flat.size)
    out: dict[str, float] = {"nan_count": float(nan), "inf_count": float(inf)}
    if finite.size:
        values = finite.astype(np.float64)
        out.update(
            min=float(values.min()),
            max=float(values.max()),
            mean=float(values.mean()),
            std=float(values.std()),
            norm=math.sqrt(float(np.dot(values, values))),
        )
    else:
        out.update(min=math.nan, max=math.nan, mean=math.nan, std=math.nan, norm=math.nan)
    out["zero_fraction"] = float(np.count_nonzero(flat == 0)) / total if total else math.nan
    return out
