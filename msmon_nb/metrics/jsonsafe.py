"""Values made JSON-safe for the pages (viewer API, panel messages).

JSON has no NaN or Infinity, and a training curve's NaN is the most important number on
it: a non-finite float becomes the string ``"nan"``, ``"inf"`` or ``"-inf"`` (the pages'
``fmtNum`` prints them as they are). Numpy scalars and arrays become Python numbers and
lists; anything with ``as_json()`` (a snapshot's ``Histogram``) is converted through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def jsonable(obj: Any) -> Any:
    """``obj`` with numpy values, histograms and non-finite floats made JSON-safe."""
    if isinstance(obj, float | np.floating):
        value = float(obj)
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(obj, np.integer | np.bool_):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if hasattr(obj, "as_json"):
        return jsonable(obj.as_json())
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    return obj
