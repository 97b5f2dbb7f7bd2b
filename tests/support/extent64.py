"""The float64 reference for ``metrics.extent``'s statistics (``act/``, ``param/`` and the
optimizer-state extents): what a test compares the monitor's values with, written from the
definitions, not from the code under test."""

from __future__ import annotations

import numpy as np


def stats64(array: np.ndarray) -> dict[str, float]:
    """norm, max_abs, mean, nonfinite and zero_frac of ``array``, in float64."""
    x = np.asarray(array).astype(np.float64).reshape(-1)
    return {
        "norm": float(np.sqrt((x * x).sum())),
        "max_abs": float(np.abs(x).max()),
        "mean": float(x.mean()),
        "nonfinite": float((~np.isfinite(x)).sum()),
        "zero_frac": float((x == 0).sum()) / x.size,
    }
