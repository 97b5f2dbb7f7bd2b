"""The viewer's JSON API (the table in docs/guide/viewer.md), independent of HTTP plumbing.

JSON has no NaN or Infinity, and a training curve's NaN is the most important point on
it, so non-finite numbers are encoded explicitly:

* in ``/api/scalars``, ``values[i]`` is ``null`` for a non-finite point (the line breaks
  there) and ``nonfinite`` lists every such point of the response as
  ``{"steps": [...], "kinds": ["nan" | "inf" | "-inf", ...]}``;
* anywhere else (alerts, snapshot stats, ``min``/``max``) a non-finite number is the
  string ``"nan"``, ``"inf"`` or ``"-inf"``.

Distributed runs: ``/api/runs`` gives each run's ``rank_last_step`` and ``rank_status``
(``{"<rank>": ...}``); ``/api/scalars`` serves one rank with ``rank=K`` and all ranks
merged with ``rank=all`` (the mean as ``values``, the band as ``band_min``/``band_max``,
``rank_count`` ranks per point; see ``scalars``); ``/api/alerts`` adds the cross-rank
alerts, marked ``"cross_rank": true``, to the ranks' own.

Errors are ``ApiError(status, message)``; the server turns them into
``{"error": message}`` with that status (404 for an unknown run or tag).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from msmon_nb.diagnose.alert import with_chart
from msmon_nb.metrics.charts import HEATMAP_PREFIXES, plan_charts
from msmon_nb.metrics.decimate import (
    downsample,
    downsample_band,
    nonfinite_kinds,
    range_slice,
    select_range,
)
from msmon_nb.metrics.jsonsafe import jsonable
from msmon_nb.viewer.store import RunStore, UnknownRun

DEFAULT_MAX_POINTS = 1000
MAX_MAX_POINTS = 200_000


class ApiError(Exception):
    """A request the API refuses: HTTP status and a message for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _one(query: Mapping[str, list[str]], name: str, required: bool = True) -> str | None:
    values = query.get(name)
    if not values:
        if required:
            raise ApiError(400, f"missing query parameter {name!r}")
        return None
    if len(values) > 1:
        raise ApiError(400, f"query parameter {name!r} given {len(values)} times")
    return values[0]


def _int(query: Mapping[str, list[str]], name: str) -> int | None:
    text = _one(query, name, required=False)
    if text is None or text == "":
        return None
    try:
        return int(float(text))  # the page sends zoom edges as floats
    except (ValueError, OverflowError):
        raise ApiError(400, f"{name}={text!r} is not a number, e.g. {name}=100") from None


def runs(store: RunStore, query: Mapping[str, list[str]]) -> Any:
    """``[{name, path, tags, last_step, status, ranks, last_write, exact, rank_last_step,
    rank_status}]``."""
    return store.list_runs()


def charts(store: RunStore, query: Mapping[str, list[str]]) -> Any:
    """``/api/charts?run=A[&run=B...]``: the charts of those runs' tags together, in the
    order the notebook panel draws them (``msmon_nb.metrics.charts.plan_charts``):
    ``[{title, tags, labels, note, log, group, kind}]`` (``labels``: each tag's legend
    text, an optimizer's series named by its optimizer; ``note``: the title's hover text;
    ``kind: "heatmap"`` adds ``rows`` and ``stats``, docs/PROTOCOL.md)."""
    names = query.get("run") or []
    if not names:
        raise ApiError(400, "missing query parameter 'run' (one or more), e.g. run=my_run")
    listed = {r["name"]: r for r in store.list_runs()}
    missing = [n for n in names if n not in listed]
    if missing:
        raise ApiError(404, f"no run {missing[0]!r} under {store.base}")
    tags = sorted({t for n in names for t in listed[n]["tags"]})
    if any(t.startswith(HEATMAP_PREFIXES) for t in tags):
        # a heatmap's rows follow the order its modules were first recorded in (forward
        # order), which the sorted listing lost: that order first, the rest after it
        recorded: dict[str, None] = {}
        for name in names:
            recorded.update(dict.fromkeys(store.recorded_tags(name)))
        tags = [t for t in recorded if t in set(tags)] + [t for t in tags if t not in recorded]
    return [chart.as_json() for chart in plan_charts(tags, placeholders=False)]


def _nullable(values: np.ndarray) -> list[float | None]:
    """``values`` as a list with None for each non-finite number."""
    out: list[float | None] = values.tolist()
    for i in np.flatnonzero(~np.isfinite(values)).tolist():
        out[i] = None
    return out


def scalars(store: RunStore, query: Mapping[str, list[str]]) -> Any:
    """One series, min/max-downsampled to about ``max_points`` (see module docstring).

    ``rank=K`` picks a rank of a distributed run (default: its lowest; ``rank`` in the
    answer is always the rank served, 0 for a single-process run). ``rank=all``
    merges the ranks: ``values`` is the mean across ranks per step (NaN if any rank's
    value is), ``band_min``/``band_max`` the lowest and highest finite value of any rank
    over the bucket each point stands for (at raw resolution: at that step), and
    ``rank_count`` the fewest ranks present in that bucket; ``min``/``max`` span the band.
    """
    run, tag = _one(query, "run"), _one(query, "tag")
    max_points = _int(query, "max_points")
    if max_points is None:  # absent or empty: the default; 0 is a number, and refused
        max_points = DEFAULT_MAX_POINTS
    if not 2 <= max_points <= MAX_MAX_POINTS:
        raise ApiError(400, f"max_points={max_points}: use 2..{MAX_MAX_POINTS}, e.g. 1000")
    start, end = _int(query, "start"), _int(query, "end")
    merged = _one(query, "rank", required=False) == "all"
    rank = None if merged else _int(query, "rank")
    zoomed = start is not None or end is not None  # a zoom asks for exact (raw) points
    try:
        if merged:
            series = store.merged(run, tag, exact=zoomed)
        else:
            rank, series = store.scalars(run, tag, rank=rank, exact=zoomed)
    except UnknownRun:
        raise ApiError(404, f"no run {run!r} under {store.base}") from None
    except KeyError as exc:
        raise ApiError(404, str(exc.args[0]) if exc.args else str(exc)) from None
    all_steps = series.steps
    common = {
        "run": run,
        "tag": tag,
        "rank": "all" if merged else rank,  # the rank served, not the one asked
        "first_step": int(all_steps[0]) if len(all_steps) else None,
        "last_step": int(all_steps[-1]) if len(all_steps) else None,
    }
    if merged:
        return {**common, **_band(series, start, end, max_points)}
    steps, values = select_range(series.steps, series.values, start, end)
    sampled = downsample(steps, values, max_points)
    vals = sampled.values
    finite = vals[np.isfinite(vals)]
    bad_idx, kinds = nonfinite_kinds(vals)
    return {
        **common,
        "steps": sampled.steps.tolist(),
        "values": _nullable(vals),
        "min": float(finite.min()) if len(finite) else None,
        "max": float(finite.max()) if len(finite) else None,
        "raw": sampled.raw and getattr(series, "exact", True),
        "count": sampled.count,
        "nonfinite": {"steps": sampled.steps[bad_idx].tolist(), "kinds": kinds},
    }


def _band(merged: Any, start: int | None, end: int | None, max_points: int) -> dict[str, Any]:
    """The ``rank=all`` part of ``/api/scalars`` (see ``scalars``)."""
    cut = range_slice(merged.steps, start, end)
    sampled = downsample_band(
        merged.steps[cut],
        merged.mean[cut],
        merged.min[cut],
        merged.max[cut],
        merged.count[cut],
        max_points,
    )
    bad_idx, kinds = nonfinite_kinds(sampled.values)
    low = sampled.low[np.isfinite(sampled.low)]
    high = sampled.high[np.isfinite(sampled.high)]
    # the median and the outlier ranks at the points kept (their steps are merged.steps')
    at = cut.start + np.searchsorted(merged.steps[cut], sampled.steps)
    extra: dict[str, Any] = {}
    if merged.median is not None:
        extra["median"] = _nullable(merged.median[at])
        extra["outliers"] = [
            {"rank": int(r), "values": _nullable(v[at])} for r, v in (merged.outliers or {}).items()
        ]
    return {
        "steps": sampled.steps.tolist(),
        "values": _nullable(sampled.values),
        "band_min": _nullable(sampled.low),
        "band_max": _nullable(sampled.high),
        "rank_count": sampled.count.tolist(),
        "min": float(low.min()) if len(low) else None,
        "max": float(high.max()) if len(high) else None,
        "raw": sampled.raw and merged.exact,
        "count": sampled.n,
        "nonfinite": {"steps": sampled.steps[bad_idx].tolist(), "kinds": kinds},
        **extra,
    }


def _per_run(store: RunStore, query: Mapping[str, list[str]], what: str) -> Any:
    name = _one(query, "run")
    readers = {
        "alerts": lambda n: [with_chart(a) for a in store.alerts(n)],
        "snapshots": store.snapshots,
        "interventions": store.interventions,
        "checkpoints": store.checkpoints,
    }
    try:
        items = readers[what](name)
    except UnknownRun:
        raise ApiError(404, f"no run {name!r} under {store.base}") from None
    return jsonable(items)


def alerts(store: RunStore, query: Mapping[str, list[str]]) -> Any:
    """The run's alerts, by step: each rank's own, and the cross-rank ones
    (``"cross_rank": true``, with the rank they name)."""
    return _per_run(store, query, "alerts")


def snapshots(store: RunStore, query: Mapping[str, list[str]]) -> Any:
    """The run's tensor snapshots: stats, and the histogram as edges and counts."""
    return _per_run(store, query, "snapshots")


def interventions(store: RunStore, query: Mapping[str, list[str]]) -> Any:
    """What was done to the run while it trained (commands and alert actions that change
    training), every rank's, by time: ``step``, ``time``, ``who``, ``what``, ``arg``,
    ``ok``, ``message``, ``rank``."""
    return _per_run(store, query, "interventions")


def checkpoints(store: RunStore, query: Mapping[str, list[str]]) -> Any:
    """The run's saved checkpoints: ``rank``, ``step``, ``path``, ``bytes``, ``time``."""
    return _per_run(store, query, "checkpoints")


ROUTES: dict[str, Callable[[RunStore, Mapping[str, list[str]]], Any]] = {
    "/api/runs": runs,
    "/api/charts": charts,
    "/api/scalars": scalars,
    "/api/alerts": alerts,
    "/api/snapshots": snapshots,
    "/api/interventions": interventions,
    "/api/checkpoints": checkpoints,
}
