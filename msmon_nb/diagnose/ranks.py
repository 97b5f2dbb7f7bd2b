"""Rules across the ranks of a distributed run: each alert names the rank and its onset.

They compare the ranks' own files (each rank writes its own records; nothing extra runs
in the training hot path) and are evaluated over whole series by ``rank_alerts``, for a
run on disk, a notebook following a job, or the viewer.

* ``grad_norm_mismatch`` -- after the all-reduce every rank applies the same gradients,
  so their global norms must agree; a relative spread above ``rtol`` (for ``patience``
  steps) means a rank skipped or corrupted the reduction.
* ``loss_spread`` -- ranks see different batches, so their losses differ by noise; a
  spread (max - min across ranks) growing to ``factor`` times its level over the first
  ``window`` steps, and above ``floor`` times the early loss, means the replicas drifted
  apart. The spread is absolute: a relative one grows by itself as the loss falls.
* ``straggler`` -- a rank whose own time is above the ranks' median by ``margin`` (and
  by at least ``min_secs``) for ``patience`` steps. Own time is ``train/data_time``
  when recorded: with a synchronous all-reduce every rank's step takes as long as the
  slowest, and the fast ranks spend the difference waiting inside the reduction, so
  only the time spent outside the framework tells who is slow. Without it, step_time.
* ``rank_stopped`` -- a rank that stopped writing (its process gone, or ``lag`` steps
  behind the furthest rank) while the others went on or are still running.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from msmon_nb.diagnose.alert import Alert

DEFAULTS: dict[str, dict[str, float]] = {
    "grad_norm_mismatch": {"rtol": 1e-4, "patience": 2},
    "loss_spread": {"factor": 3.0, "floor": 0.1, "window": 20},
    "straggler": {"margin": 0.5, "min_secs": 0.005, "patience": 3},
    "rank_stopped": {"lag": 5, "stale_secs": 10.0},
}
SEVERITY = {
    "grad_norm_mismatch": "critical",
    "loss_spread": "warning",
    "straggler": "warning",
    "rank_stopped": "critical",
}

Series = Any  # anything with .steps and .values (ScalarSeries, metrics Series)


def _aligned(per_rank: Mapping[int, Series]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(ranks, common steps, values[rank_index, step_index]) over steps every rank has."""
    ranks = sorted(per_rank)
    if not ranks:
        return ranks, np.zeros(0, np.int64), np.zeros((0, 0))
    all_steps = [np.asarray(per_rank[rank].steps) for rank in ranks]
    first = all_steps[0]
    if all(len(s) == len(first) and np.array_equal(s, first) for s in all_steps[1:]):
        # the usual case (every rank collected the same steps): no intersection needed
        values = np.vstack([np.asarray(per_rank[r].values, dtype=np.float64) for r in ranks])
        return ranks, first, values
    common = all_steps[0]
    for steps in all_steps[1:]:
        common = np.intersect1d(common, steps)
    rows = [
        np.asarray(per_rank[rank].values, dtype=np.float64)[np.searchsorted(steps, common)]
        for rank, steps in zip(ranks, all_steps, strict=True)
    ]
    return ranks, common, np.vstack(rows) if rows else np.zeros((len(ranks), 0))


def _first_run(mask: np.ndarray, patience: int) -> int | None:
    """Index where ``patience`` True values in a row begin, or None."""
    if len(mask) < patience:
        return None
    full = np.convolve(mask.astype(np.int64), np.ones(patience, dtype=np.int64), "valid")
    hits = np.nonzero(full == patience)[0]
    return int(hits[0]) if hits.size else None


def grad_norm_mismatch(per_rank: Mapping[int, Series], rtol: float, patience: int) -> list[Alert]:
    """See the module docstring."""
    ranks, steps, values = _aligned(per_rank)
    if len(ranks) < 2 or not len(steps):
        return []
    finite = np.isfinite(values).all(axis=0)
    median = np.median(values, axis=0)
    spread = (values.max(axis=0) - values.min(axis=0)) / np.maximum(np.abs(median), 1e-12)
    start = _first_run((spread > rtol) & finite, int(patience))
    if start is None:
        return []
    end = start + int(patience) - 1
    worst = ranks[int(np.argmax(np.abs(values[:, start] - median[start])))]
    message = (
        f"grad_norm differs across ranks since step {steps[start]}: "
        f"{', '.join(f'rank {r} {values[i, start]:.6g}' for i, r in enumerate(ranks))} "
        f"(relative spread {spread[start]:.2g} > {rtol:g}); after the all-reduce every rank "
        "should apply the same gradients: check that every rank runs the gradient reducer "
        "(DistributedGradReducer / parallel_mode) with the same mean/degree"
    )
    return [
        _alert(
            "grad_norm_mismatch",
            steps[end],
            steps[start],
            message,
            "train/grad_norm",
            worst,
            spread[start],
        )
    ]


def loss_spread(
    per_rank: Mapping[int, Series], factor: float, floor: float, window: int
) -> list[Alert]:
    """See the module docstring."""
    ranks, steps, values = _aligned(per_rank)
    window = int(window)
    if len(ranks) < 2 or len(steps) < 2 * window:
        return []
    center = np.median(values, axis=0)
    spread = values.max(axis=0) - values.min(axis=0)
    base = float(np.median(spread[:window]))
    limit = max(factor * base, floor * float(np.median(np.abs(center[:window]))))
    rolling = np.median(np.lib.stride_tricks.sliding_window_view(spread, window), axis=1)
    over = np.nonzero(rolling[window:] > limit)[0]  # windows ending at 2*window onwards
    if not over.size:
        return []
    end = 2 * window + int(over[0])
    recent = spread[end - window : end]
    level = float(np.median(recent))
    first = end - window + int(np.argmax(recent > limit))
    worst = ranks[int(np.argmax(np.abs(values[:, first] - center[first])))]
    message = (
        f"loss spread across ranks growing since step {steps[first]}: {level:.2g}, "
        f"{base:.2g} at the start; the replicas are drifting apart (rank {worst} furthest): "
        "check that parameters are broadcast at start and gradients are averaged on every rank"
    )
    return [
        _alert("loss_spread", steps[end - 1], steps[first], message, "train/loss", worst, level)
    ]


def straggler(
    per_rank: Mapping[int, Series], margin: float, min_secs: float, patience: int, tag: str
) -> list[Alert]:
    """See the module docstring; ``tag`` is the own-time tag used."""
    ranks, steps, values = _aligned(per_rank)
    if len(ranks) < 2 or not len(steps):
        return []
    median = np.median(values, axis=0)
    out = []
    for i, rank in enumerate(ranks):
        slow = (values[i] > median * (1 + margin)) & (values[i] - median > min_secs)
        start = _first_run(slow, int(patience))
        if start is None:
            continue
        end = start + int(patience) - 1
        message = (
            f"rank {rank} is a straggler since step {steps[start]}: its {tag.split('/')[-1]} "
            f"{values[i, start] * 1e3:.1f} ms against the ranks' median "
            f"{median[start] * 1e3:.1f} ms; every rank waits for it at each all-reduce: check "
            "that rank's input pipeline, host load and device"
        )
        out.append(
            _alert("straggler", steps[end], steps[start], message, tag, rank, values[i, start])
        )
    return out


def rank_stopped(
    last_steps: Mapping[int, int | None],
    status: Mapping[int, str],
    lag: int,
    last_writes: Mapping[int, float | None] | None = None,
    stale_secs: float = 10.0,
) -> list[Alert]:
    """See the module docstring; ``status`` from the ranks' markers (interrupted = gone).

    Ranks flush on their own deadlines, so while a job runs one rank's file can trail
    another's by a second of steps; with ``last_writes`` (rank -> wall time of its newest
    record) a rank counts as behind only when its newest record is also ``stale_secs``
    older than the furthest rank's.
    """
    known = {r: s for r, s in last_steps.items() if s is not None}
    if len(known) < 2:
        return []
    furthest = max(known.values())
    walls = {r: w for r, w in (last_writes or {}).items() if w is not None}
    newest_wall = max(walls.values()) if walls else None
    alive = [r for r, s in status.items() if s == "running"]
    out = []
    for rank, last in sorted(known.items()):
        gone = status.get(rank) == "interrupted"
        behind = furthest - last >= lag
        if behind and newest_wall is not None and rank in walls:
            behind = newest_wall - walls[rank] >= stale_secs
        others_on = bool([r for r in alive if r != rank]) or furthest > last
        if (gone or behind) and others_on:
            why = "its process is gone" if gone else f"{furthest - last} steps behind"
            message = (
                f"rank {rank} stopped writing after step {last} ({why}) while "
                + (
                    f"rank(s) {', '.join(map(str, alive))} still run"
                    if alive
                    else f"others reached step {furthest}"
                )
                + "; a hung or dead rank blocks every collective: check its log (msrun --log_dir)"
            )
            out.append(_alert("rank_stopped", furthest, last + 1, message, "", rank, float(last)))
    return out


def _alert(
    kind: str, step: Any, since: Any, message: str, tag: str, rank: int, value: Any
) -> Alert:
    return Alert(int(step), kind, SEVERITY[kind], message, int(since), tag, float(value), int(rank))


def rank_alerts(run: Any, settings: Mapping[str, Mapping[str, float]] | None = None) -> list[Alert]:
    """Every cross-rank alert of a ``Run`` with several ranks (empty for one rank)."""
    ranks = run.ranks
    if len(ranks) < 2:
        return []
    conf = {k: dict(v, **dict((settings or {}).get(k, {}))) for k, v in DEFAULTS.items()}

    def per_rank(tag: str) -> dict[int, Series]:
        out = {}
        for rank in ranks:
            if tag in run.tags(rank=rank):
                out[rank] = run.scalars(tag, rank=rank)
        return out if len(out) == len(ranks) else {}

    alerts: list[Alert] = []
    alerts += grad_norm_mismatch(per_rank("train/grad_norm"), **conf["grad_norm_mismatch"])
    alerts += loss_spread(per_rank("train/loss"), **conf["loss_spread"])
    own_tag = "train/data_time" if per_rank("train/data_time") else "train/step_time"
    alerts += straggler(per_rank(own_tag), tag=own_tag, **conf["straggler"])
    last_write = getattr(run, "rank_last_write", None)
    alerts += rank_stopped(
        run.rank_last_step(),
        run.rank_status(),
        last_writes=last_write() if last_write is not None else None,
        **conf["rank_stopped"],
    )
    return sorted(alerts, key=lambda a: (a.since_step, a.kind))


def with_cross_rank(own: list[dict[str, Any]], computed: list[dict[str, Any]]) -> list[dict]:
    """A run's recorded alerts plus freshly computed cross-rank ones, each problem once.

    Rank 0 records the cross-rank alerts it found while training (``cross_rank: true`` in
    its alerts.jsonl); a reader that recomputes them over the finished files keeps its
    own result for a (kind, rank) and drops the recorded copy.
    """
    fresh = {(a.get("kind"), a.get("rank")) for a in computed}
    kept = [a for a in own if not (a.get("cross_rank") and (a.get("kind"), a.get("rank")) in fresh)]
    return kept + list(computed)
