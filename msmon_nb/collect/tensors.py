"""Turning MindSpore tensors, numpy arrays and numbers into host values."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


def to_numpy(value: Any) -> np.ndarray:
    """A host array for a MindSpore Tensor/Parameter, numpy array or number."""
    if isinstance(value, np.ndarray):
        return value
    asnumpy = getattr(value, "asnumpy", None)
    if asnumpy is not None:
        try:
            return asnumpy()
        except TypeError:  # bfloat16 and other dtypes numpy lacks
            import mindspore as ms

            return value.astype(ms.float32).asnumpy()
    return np.asarray(value)


def to_float(value: Any) -> float | None:
    """A Python float for a scalar-like value (the mean of a larger tensor); None stays None."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, tuple | list):
        if not value:
            return None
        return to_float(value[0])
    if getattr(value, "size", None) == 1:
        # one element: ``item()`` reads it without building an array (0.2-0.7 us
        # against 5-8 us for ``asnumpy()``, whose numpy view parses a PEP 3118 format
        # string on each call; MindSpore 2.7.1 and 2.10, float32/16, bfloat16, int, bool)
        item = getattr(value, "item", None)
        if item is not None:
            try:
                return float(item())
            except (TypeError, ValueError, RuntimeError):
                pass
    arr = to_numpy(value)
    if arr.size == 1:
        return float(arr.reshape(()))
    if arr.size == 0:
        return None
    return float(np.mean(arr, dtype=np.float64))


def flatten_tensors(value: Any) -> list[Any]:
    """Every tensor-like leaf of nested tuples/lists/dicts (gradient structures)."""
    out: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None:
            continue
        if isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, tuple | list):
            stack.extend(reversed(item))
        elif hasattr(item, "asnumpy") or isinstance(item, np.ndarray):
            out.append(item)
    return out


def batch_size_of(args: Iterable[Any]) -> int | None:
    """Leading dimension of the first array-like argument (the batch, by convention)."""
    for arg in args:
        shape = getattr(arg, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return None
