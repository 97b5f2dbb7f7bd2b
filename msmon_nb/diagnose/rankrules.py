"""Rules across the ranks of a distributed run: each alert names the rank and its onset.

They compare the ranks' own files (each rank writes its own records; no collective is
added to training) and are evaluated over whole series by ``rank_alerts``, for a run on
disk, rank 0's watcher process while the job runs (``rankwatch``), a notebook following
a job, or the viewer.

* ``grad_norm_mismatch`` -- after the all-reduce every rank applies the same gradients,
  so their global norms must agree; a relative spread above ``rtol`` (for ``patience``
  steps) means a rank skipped or corrupted the reduction.
* ``loss_spread`` -- ranks see different batches, so their losses differ by noise; a
  spread (max - min across ranks) growing to ``factor`` times its level over the first
  ``window`` steps, and above ``floor`` times the early loss, means the replicas drifted
  apart. The spread is absolute: a relative one grows by itself as the loss falls.
* ``straggler`` -- with a synchronous all-reduce every rank's step takes as long as the
  slowest one's, and the fast ranks spend the difference waiting inside the reduction.
  So when the ranks record ``train/comm_busy`` and ``train/comm_wait`` (their own work
  between two gradient all-reduces, and the time they waited inside one:
  ``collect.comm``), the straggler is the rank the others wait for: busy longer than
  the others' median by ``min_secs`` and by the fraction ``margin``, while they wait
  longer than it, in most of ``window`` consecutive collected steps (settings
  ``straggler_wait``). This finds slowness wherever it is (input pipeline, host load,
  a ``time.sleep`` in the user's loop). Without them, the rank whose own time is above the
  ranks' median by ``margin`` (and by ``min_secs``) for ``patience`` steps, own time
  being ``train/data_time`` when recorded, else step_time (which cannot single out a
  rank behind a synchronous all-reduce).
* ``rank_grad_spike`` / ``rank_loss_spike`` -- data parallel averages the ranks'
  gradients, so a batch gone wrong on one rank shows in the global grad_norm (or the
  mean loss) with no sign of where it came from. At a step where the global value is
  ``global_factor`` times its median over the previous ``window`` collected steps, the
  ranks whose own value (``train/local_grad_norm``, ``train/local_loss``) is
  ``local_factor`` times their own median are named, when they are at most half of the
  ranks (all ranks rising together is not one rank's batch; the single-rank rules cover
  it). Consecutive spike steps from the same ranks are one alert.
* ``rank_stopped`` -- a rank that stopped writing (its process gone, or ``lag`` steps
  behind the furthest rank) while the others went on or are still running.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from msmon_nb.config import DATA_TAG
from msmon_nb.config.cards import CARDS, SEVERITY
from msmon_nb.diagnose.alert import Alert

DEFAULTS: dict[str, dict[str, float]] = {
    "grad_norm_mismatch": {"rtol": 1e-4, "patience": 2},
    "loss_spread": {"factor": 3.0, "floor": 0.1, "window": 20},
    "straggler": {"margin": 0.5, "min_secs": 0.005, "patience": 3},
    # a loaded host makes a rank slow for a few steps (seen on a 2-core machine at load
    # 12-15: 7 of 10 steps at 1.6x, 9 of 16 at up to 2x) and hiccups interrupt a real
    # straggler: most of ``window`` steps at twice the others' busy time decide
    "straggler_wait": {"margin": 1.0, "min_secs": 0.05, "window": 20},
    "rank_spike": {"global_factor": 2.0, "local_factor": 4.0, "window": 20, "min_history": 5},
    "rank_stopped": {"lag": 5, "stale_secs": 10.0},
}
WAIT_TAG = "train/comm_wait"
BUSY_TAG = "train/comm_busy"

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


def _first_majority(mask: np.ndarray, window: int) -> tuple[int, int] | None:
    """(onset, confirmed): ``confirmed`` is the first index where more than half of the
    last ``window`` values are True; the onset is where, in that window, the True
    stretch begins: the True index ``s`` maximising sum(+1 per True, -1 per False) from
    ``s`` to ``confirmed`` (a change-point estimate: an isolated hiccup a few steps
    before a straggler starts is not its onset, a hiccup inside the slow stretch does not
    cut it); None when never."""
    window = int(window)
    counts = np.convolve(mask.astype(np.int64), np.ones(window, dtype=np.int64))[: len(mask)]
    hits = np.nonzero(counts > window // 2)[0]
    if not hits.size:
        return None
    end = int(hits[0])
    start = max(0, end - window + 1)
    part = mask[start : end + 1]
    score = np.cumsum((2 * part.astype(np.int64) - 1)[::-1])[::-1]
    score = np.where(part, score, np.iinfo(np.int64).min)
    return start + int(np.argmax(score)), end


def straggler_by_wait(
    busy: Mapping[int, Series],
    waits: Mapping[int, Series],
    margin: float,
    min_secs: float,
    window: int,
) -> list[Alert]:
    """See the module docstring: ``busy`` holds ``train/comm_busy`` (each rank's own
    work between two all-reduces), ``waits`` ``train/comm_wait``.

    A rank is slow at a step when it is busy longer than the other ranks' median by
    ``min_secs`` and by the fraction ``margin`` of it, *and* the others wait longer than
    it inside the all-reduce: both, because the wait alone holds an uneven transfer time
    and the busy time alone a moment of host noise that nobody waited for. It is a
    straggler once it is slow in more than half of ``window`` consecutive collected steps;
    the onset is the first slow step of those.
    """
    ranks, steps, values = _aligned(busy)
    w_ranks, w_steps, w_values = _aligned(waits)
    if len(ranks) < 2 or not len(steps) or w_ranks != ranks:
        return []
    steps, bi, wi = np.intersect1d(steps, w_steps, return_indices=True)
    values, w_values = values[:, bi], w_values[:, wi]
    finite = np.isfinite(values).all(axis=0) & np.isfinite(w_values).all(axis=0)
    out = []
    for i, rank in enumerate(ranks):
        others = np.median(np.delete(values, i, axis=0), axis=0)
        others_wait = np.median(np.delete(w_values, i, axis=0), axis=0)
        own = values[i]
        slow = (own - others > min_secs) & (own > others * (1 + margin))
        slow &= (others_wait > w_values[i]) & finite
        found = _first_majority(slow, window)
        if found is None:
            continue
        start, end = found
        message = (
            f"rank {rank} is a straggler since step {steps[start]}: it works "
            f"{own[start] * 1e3:.0f} ms between gradient all-reduces against the others' "
            f"{others[start] * 1e3:.0f} ms, and they wait {others_wait[start] * 1e3:.0f} ms for "
            f"it inside each all-reduce ({w_values[i, start] * 1e3:.0f} ms for it): check that "
            "rank's input pipeline, host load (other processes, CPU binding) and device"
        )
        out.append(
            _alert("straggler", steps[end], steps[start], message, BUSY_TAG, rank, own[start])
        )
    return out


def _trailing_median(values: np.ndarray, window: int, min_history: int) -> np.ndarray:
    """Median of the ``window`` values before each index (NaN with < ``min_history``)."""
    padded = np.concatenate([np.full(window, np.nan), values])
    windows = np.lib.stride_tricks.sliding_window_view(padded, window)[: len(values)]
    enough = np.count_nonzero(~np.isnan(windows), axis=1) >= min_history
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows at the start
        median = np.nanmedian(windows, axis=1)
    return np.where(enough, median, np.nan)


def _ratio(value: float) -> str:
    return f"x{value:.3g}" if np.isfinite(value) else "non-finite"


def rank_spike(
    local: Mapping[int, Series],
    global_: Mapping[int, Series] | None,
    kind: str,
    global_factor: float,
    local_factor: float,
    window: int,
    min_history: int,
    max_alerts: int = 20,
) -> list[Alert]:
    """See the module docstring. ``global_``: every rank's global series (grad_norm,
    equal on all ranks after the all-reduce), or None for the ranks' mean (loss)."""
    ranks, steps, values = _aligned(local)
    if len(ranks) < 2 or len(steps) <= min_history:
        return []
    if global_ is None:
        center = values.mean(axis=0)
    else:
        g_ranks, g_steps, g_values = _aligned(global_)
        if len(g_ranks) < len(ranks):
            return []
        common, li, gi = np.intersect1d(steps, g_steps, return_indices=True)
        steps, values = common, values[:, li]
        center = np.median(g_values[:, gi], axis=0)
    window, min_history = int(window), int(min_history)
    base = _trailing_median(center, window, min_history)
    with np.errstate(all="ignore"):
        spiking = (base > 0) & ((center > global_factor * base) | ~np.isfinite(center))
    events: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    for t in np.nonzero(spiking)[0][: 50 * max_alerts]:
        history = values[:, max(0, t - window) : t]
        own = np.array(
            [np.median(h[np.isfinite(h)]) if np.isfinite(h).sum() else np.nan for h in history]
        )
        with np.errstate(all="ignore"):
            ratio = np.where(np.isfinite(values[:, t]), values[:, t] / own, np.inf)
        ratio = np.where(own > 0, ratio, np.nan)
        culprits = tuple(int(i) for i in np.nonzero(ratio >= local_factor)[0])
        if culprits and 2 * len(culprits) <= len(ranks):
            events.append((int(t), culprits, ratio))
    out: list[Alert] = []
    what, noun = ("grad_norm", "norm") if kind == "rank_grad_spike" else ("loss", "loss")
    tag = "train/local_grad_norm" if kind == "rank_grad_spike" else "train/local_loss"
    i = 0
    while i < len(events) and len(out) < max_alerts:
        first, culprits, ratio = events[i]
        last = first
        while i + 1 < len(events) and events[i + 1][1] == culprits and events[i + 1][0] == last + 1:
            i += 1
            last = events[i][0]
        i += 1
        others = [r for r in range(len(ranks)) if r not in culprits]
        worst_other = max((ratio[r] for r in others if np.isfinite(ratio[r])), default=1.0)
        g_ratio = center[first] / base[first]
        for r in culprits:
            also = [ranks[c] for c in culprits if c != r]
            message = (
                f"{what} spike at step {steps[first]} ({_ratio(g_ratio)} its median) came from "
                f"rank {ranks[r]}"
                + (f" and rank(s) {', '.join(map(str, also))}" if also else "")
                + f": local {noun} {_ratio(ratio[r])} its median, others normal (at most "
                f"{_ratio(worst_other)}); that rank's batch was an outlier: check the samples "
                "it read at that step (a corrupt, mislabelled or unnormalised record) and clip "
                "or skip such batches"
            )
            out.append(
                _alert(kind, steps[last], steps[first], message, tag, ranks[r], values[r, first])
            )
    return out


def alert_key(alert: Any) -> tuple[Any, ...]:
    """What makes two cross-rank alerts the same problem: (kind, rank), plus the onset
    for kinds that recur (a rank can send several outlier batches)."""
    kind, rank = alert.get("kind"), alert.get("rank")
    found = CARDS.get(kind)
    per_onset = found is not None and found.per_onset  # may recur for one rank
    return (kind, rank, alert.get("since_step")) if per_onset else (kind, rank)


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
    waits, busy = per_rank(WAIT_TAG), per_rank(BUSY_TAG)
    if waits and busy:  # who the others wait for; else the rank's own time
        alerts += straggler_by_wait(busy, waits, **conf["straggler_wait"])
    else:
        own_tag = DATA_TAG if per_rank(DATA_TAG) else "train/step_time"
        alerts += straggler(per_rank(own_tag), tag=own_tag, **conf["straggler"])
    local_norm = per_rank("train/local_grad_norm")
    if local_norm:
        alerts += rank_spike(
            local_norm, per_rank("train/grad_norm"), "rank_grad_spike", **conf["rank_spike"]
        )
    local_loss = per_rank("train/local_loss")
    if local_loss:
        alerts += rank_spike(local_loss, None, "rank_loss_spike", **conf["rank_spike"])
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
    own result for the same problem (``alert_key``) and drops the recorded copy.
    """
    fresh = {alert_key(a) for a in computed}
    kept = [a for a in own if not (a.get("cross_rank") and alert_key(a) in fresh)]
    return kept + list(computed)
