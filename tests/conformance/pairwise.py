"""An all-pairs cover: every pair of values of any two axes appears in some case.

Greedy and deterministic (the same axes give the same cases): each new case starts from
the first pair not yet covered and fills the other axes one by one with the value that
covers most new pairs, skipping combinations ``allowed`` rejects. Pairs no allowed case
can hold are left out (and returned, so the test can say so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations
from typing import Any

Row = tuple[Any, ...]


def all_pairs(
    axes: Sequence[Sequence[Any]], allowed: Callable[[Row], bool] = lambda row: True
) -> tuple[list[Row], set[tuple[int, Any, int, Any]]]:
    """(cases, pairs no allowed case can cover) for ``axes`` (one value list per axis)."""
    pairs = {
        (i, a, j, b) for i, j in combinations(range(len(axes)), 2) for a in axes[i] for b in axes[j]
    }
    impossible = {p for p in pairs if not _completable(axes, {p[0]: p[1], p[2]: p[3]}, allowed)}
    todo = pairs - impossible
    rows: list[Row] = []
    while todo:
        i, a, j, b = min(todo, key=repr)
        fixed = {i: a, j: b}
        for k in range(len(axes)):
            if k in fixed:
                continue
            best = max(
                (v for v in axes[k] if _completable(axes, {**fixed, k: v}, allowed)),
                key=lambda v, k=k: _gain(todo, {**fixed, k: v}),
            )
            fixed[k] = best
        row = tuple(fixed[k] for k in range(len(axes)))
        rows.append(row)
        todo -= _covered(row)
    return rows, impossible


def _covered(row: Row) -> set[tuple[int, Any, int, Any]]:
    return {(i, row[i], j, row[j]) for i, j in combinations(range(len(row)), 2)}


def _gain(todo: set, fixed: dict[int, Any]) -> int:
    keys = sorted(fixed)
    return sum((i, fixed[i], j, fixed[j]) in todo for i, j in combinations(keys, 2))


def _completable(axes: Sequence[Sequence[Any]], fixed: dict[int, Any], allowed) -> bool:
    """Whether some allowed row agrees with ``fixed`` (depth-first; the axes are small)."""

    def fill(k: int, row: list[Any]) -> bool:
        if k == len(axes):
            return allowed(tuple(row))
        values = [fixed[k]] if k in fixed else axes[k]
        return any(fill(k + 1, [*row, v]) for v in values)

    return fill(0, [])
