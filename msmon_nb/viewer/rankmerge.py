"""Distributed runs as the viewer holds them: one rank at a time, done ranks kept compact.

A job of 64 ranks x 100,000 steps x 5 tags is 32 M points. ``Run`` keeps a step, a value
and a wall time for each (20 bytes) for every rank at once; the viewer needs steps and
values only, and a rank records the same steps for each of its tags. So in a run laid
out as ``rank_<k>/`` dirs (how ``Monitor`` writes under msrun), each rank is read by a
``Run`` of its own, one rank at a time, and a rank that is done (its marker says
finished, stopped or interrupted) is then kept compact: the float32 values, and one steps
array shared by every tag and rank that recorded the same steps (about 4 bytes a point),
its ``Run`` dropped. A rank still
being written keeps its ``Run``, which tails its files cheaply, until it is done. A done
rank whose files change again (a restart) is read afresh.

Merging (``merge_ranks``, ``merge_blocks``) lives in ``events/rankmerge.py``, shared with
``Run.merged``.

A done rank whose writer left a complete overview (``events.overview``: one row per 64
scalars of a tag, checked against its files' sizes) is not decoded at first: its series
are the blocks' min/max points (``exact`` False: never served as raw points) and its merged
chart comes from the blocks (``merge_blocks``: a 64-rank job of 100,000 steps in well under
a second, where decoding takes seconds). The first request that needs exact points (a zoom,
or a rank without an overview) decodes the rank as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from msmon_nb.events.overview import BLOCK, Overview, points, read_overview
from msmon_nb.events.rankmerge import Merged, merge_blocks, merge_ranks
from msmon_nb.events.runs import Run
from msmon_nb.rundir import (
    ALERTS,
    INTERVENTIONS,
    MARKER,
    SNAPSHOTS,
    checkpoint_files,
    is_summary_file,
    rank_dirs,
    read_jsonl,
    read_marker_file,
    run_status,
)

# a done rank is served from its overview only from this many scalars on (decoding them
# takes ~50 ms here; a smaller rank is decoded at once and drawn from every point) ...
OVERVIEW_MIN_SCALARS = 64_000
# ... or when the whole job holds this many (~1 s of decoding): 1,024 ranks of 50,000
# scalars each were all decoded, one after the other, before the first merged chart
# (bench/long.py: 217 s at load 20, 62 s of it decoding on an idle core)
OVERVIEW_MIN_JOB_SCALARS = 1_000_000


class Points(NamedTuple):
    """One tag of one rank: steps (int64, increasing) and values (float32).

    ``exact`` is False for points taken from an overview (each block's extremes), which
    the API never calls raw."""

    steps: np.ndarray
    values: np.ndarray
    exact: bool = True


def is_ranked(path: Path) -> bool:
    """True when every summary file of the run lies in a ``rank_<k>/`` dir, and there is one."""
    try:
        flat = any(e.is_file() and is_summary_file(e.name) for e in os.scandir(path))
    except OSError:
        return False
    return not flat and bool(rank_dirs(path))


def done_overview(path: Path, job_ranks: int = 1) -> tuple[Overview, list[Path], str] | None:
    """``(overview, summary files, status)`` of the run dir ``path`` when its writer closed
    (a complete overview still true of its files), it is not running, and it is big
    enough that decoding it would keep a chart waiting (``OVERVIEW_MIN_SCALARS``, or a
    job of ``job_ranks`` such dirs holding ``OVERVIEW_MIN_JOB_SCALARS``); else None."""
    overview = read_overview(path)
    if overview is None:
        return None
    scalars = len(overview.rows) * BLOCK
    if scalars < OVERVIEW_MIN_SCALARS and scalars * job_ranks < OVERVIEW_MIN_JOB_SCALARS:
        return None  # small enough, rank and job, to decode at once
    files = [p for p in path.iterdir() if is_summary_file(p.name)]
    status = run_status(read_marker_file(path / MARKER), files)
    if status == "running":
        return None
    return overview, files, status


def overview_points(overview: Overview, tag: str) -> Points | None:
    """``tag``'s blocks as their min/max points (``exact`` False), None without rows."""
    rows = overview.tag_rows(tag)
    if rows is None or not len(rows):
        return None
    steps, values = points(rows)
    return Points(steps, values.astype(np.float32), exact=False)


def _stat_key(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def _interned(pool: list[np.ndarray], steps: np.ndarray) -> np.ndarray:
    """The array of ``pool`` equal to ``steps`` (added to the pool when there is none)."""
    for known in pool:
        if len(known) == len(steps) and np.array_equal(known, steps):
            return known
    pool.append(steps)
    return steps


def _compact_series(run: Run, pool: list[np.ndarray]) -> dict[str, Points]:
    """Every scalar tag of a decoded ``run`` as ``Points``, steps arrays shared via ``pool``."""
    series = {}
    for tag in run.tags():
        points = run.scalars(tag)
        series[tag] = Points(_interned(pool, points.steps), points.values)
    return series


class _Rank:
    """One rank: a live ``Run`` while it is written, compact ``Points`` once it is done."""

    def __init__(self, rank: int, path: Path, run_name: str, steps_pool: list[np.ndarray]) -> None:
        self.rank = rank
        self.path = path
        self.steps_pool = steps_pool  # distinct steps arrays of the run's compact ranks
        self.name = f"{run_name}/{path.name}"
        self.run: Run | None = None
        self.series: dict[str, Points] = {}
        self.snapshots: list[dict[str, Any]] = []
        self.last_step: int | None = None
        self.last_write: float | None = None
        self.problems: list[str] = []
        self.status = "running"  # running, finished, stopped, interrupted (as Run.rank_status)
        self.signature: tuple | None = None  # of the files, when compact
        self.overview: Overview | None = None  # while served from the overview
        self.decode = False  # set once exact points are wanted
        self.job_ranks = 1  # ranks in the job (RankedRun sets it): a wide job's small
        # ranks are served from their overviews too

    def _signature(self) -> tuple:
        keys = []
        try:
            names = sorted(e.name for e in os.scandir(self.path) if e.is_file())
        except OSError:
            names = []
        for name in names:
            if is_summary_file(name) or name in (MARKER, ALERTS, SNAPSHOTS):
                keys.append((name, _stat_key(self.path / name)))
        return tuple(keys)

    def refresh(self) -> bool:
        """Read what is new; True when the rank's data or status changed."""
        signature = self._signature()
        if self.run is None and signature == self.signature:
            return False
        if self.run is None and not self.decode and self._from_overview():
            self.signature = signature
            return True
        self.overview = None
        if self.run is None:  # first read, or a done rank whose files changed
            self.run = Run(self.path, name=self.name)
            self.series = {}
        before = (self.last_step, self.status)
        grew = self.run.refresh()
        run = self.run
        self.last_step = run.last_step
        self.last_write = run.last_write
        self.problems = [str(p) for p in run.problems]
        self.status = run_status(run.marker, run.files, self.last_write, time.time())
        if self.status != "running":
            self._compact(run)
            self.signature = signature
        return grew or before != (self.last_step, self.status)

    def _from_overview(self) -> bool:
        """Serve this rank from its writer's overview when that is complete and still
        true of the files (the writer closed: the rank wrote its last record)."""
        done = done_overview(self.path, self.job_ranks)
        if done is None:
            return False
        overview, files, status = done
        last = None
        for tag in overview.tags:
            rows = overview.tag_rows(tag)
            if rows is not None and len(rows):
                last = max(last or 0, int(rows["last_step"][-1]))
        self.overview = overview
        self.series = {}  # filled per tag on first use (the merged chart reads rows only)
        self.snapshots = read_jsonl(self.path / SNAPSHOTS)
        self.last_step = last
        self.last_write = max((f.stat().st_mtime for f in files), default=None)
        self.status = status
        self.problems = []
        return True

    def _overview_points(self, tag: str) -> Points | None:
        points_ = self.series.get(tag)
        if points_ is None and self.overview is not None:
            points_ = overview_points(self.overview, tag)
            if points_ is not None:
                self.series[tag] = points_
        return points_

    def blocks(self, tag: str) -> np.ndarray | None:
        """The overview rows of ``tag`` while the rank is served from its overview."""
        return None if self.overview is None else self.overview.tag_rows(tag)

    def exact(self) -> None:
        """Decode the rank's events (once): exact points from now on."""
        if self.overview is not None:
            self.decode = True
            self.signature = None
            self.overview = None
            self.refresh()

    def _compact(self, run: Run) -> None:
        self.snapshots = run.snapshots
        self.series = _compact_series(run, self.steps_pool)
        self.run = None

    def tags(self) -> list[str]:
        if self.run is not None:
            return self.run.tags()
        if self.overview is not None:
            return sorted(self.overview.tags)
        return sorted(self.series)

    def scalars(self, tag: str) -> Points:
        if self.run is not None:
            series = self.run.scalars(tag)
            return Points(series.steps, series.values)
        points = self._overview_points(tag) if self.overview is not None else self.series.get(tag)
        if points is None:
            known = ", ".join(self.tags()) or "none"
            raise KeyError(f"run {self.name!r} has no scalar tag {tag!r}; it has: {known}")
        return points

    def own_snapshots(self) -> list[dict[str, Any]]:
        return self.run.snapshots if self.run is not None else self.snapshots


class RankedRun:
    """A run of ``rank_<k>/`` dirs, with the parts of ``Run``'s interface the viewer uses."""

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        self._ranks: dict[int, _Rank] = {}
        self._steps_pool: list[np.ndarray] = []

    def __repr__(self) -> str:
        return f"RankedRun({self.name!r}, ranks={self.ranks})"

    def refresh(self) -> bool:
        """Read every rank's new records (one rank at a time); True when anything changed."""
        changed = False
        dirs = rank_dirs(self.path)
        for rank, path in dirs.items():
            state = self._ranks.get(rank)
            if state is None:
                state = self._ranks[rank] = _Rank(rank, path, self.name, self._steps_pool)
            state.job_ranks = len(dirs)
            changed = state.refresh() or changed
        in_use = {id(p.steps): p.steps for s in self._ranks.values() for p in s.series.values()}
        self._steps_pool[:] = in_use.values()
        return changed

    @property
    def ranks(self) -> list[int]:
        return sorted(self._ranks) or [0]

    def _rank(self, rank: int | None) -> _Rank:
        if rank is None:
            if not self._ranks:
                raise KeyError(f"run {self.name!r} has no data yet")
            rank = min(self._ranks)
        state = self._ranks.get(rank)
        if state is None:
            raise KeyError(f"run {self.name!r} has no rank {rank}; ranks: {self.ranks}")
        return state

    def tags(self, kind: str = "scalar", rank: int | None = None) -> list[str]:
        """Scalar tags of ``rank``, or of any rank when ``rank`` is None."""
        if kind != "scalar":
            return []
        if rank is not None:
            return self._rank(rank).tags()
        return sorted({t for state in self._ranks.values() for t in state.tags()})

    def scalars(self, tag: str, rank: int | None = None, exact: bool = False) -> Points:
        """``(steps, values)`` of ``tag`` on ``rank`` (the lowest rank when None);
        ``exact``: decode a rank served from its overview first."""
        state = self._rank(rank)
        if exact:
            state.exact()
        return state.scalars(tag)

    def overview_dir(self, rank: int) -> Path | None:
        """The rank's dir while it is served from its overview (the cross-rank rules
        then decode it in their own thread), else None."""
        state = self._rank(rank)
        return state.path if state.overview is not None else None

    def merged(self, tag: str, exact: bool = False) -> Merged:
        """``tag`` merged across the ranks that have it: from the overview blocks when
        every such rank is served from its overview and their blocks line up (and not
        ``exact``), else from every rank's decoded points."""
        states = [s for _, s in sorted(self._ranks.items()) if tag in s.tags()]
        if not states:
            known = sorted({t for s in self._ranks.values() for t in s.tags()})
            raise KeyError(
                f"run {self.name!r} has no scalar tag {tag!r} on any rank; "
                f"it has: {', '.join(known) or 'none'}"
            )
        if not exact:
            blocks = [s.blocks(tag) for s in states]
            if all(b is not None for b in blocks):
                merged = merge_blocks([s.rank for s in states], blocks)
                if merged is not None:
                    return merged
        for state in states:
            state.exact()
        return merge_ranks([s.scalars(tag) for s in states], [s.rank for s in states])

    @property
    def last_step(self) -> int | None:
        steps = [s.last_step for s in self._ranks.values() if s.last_step is not None]
        return max(steps) if steps else None

    @property
    def last_write(self) -> float | None:
        times = [s.last_write for s in self._ranks.values() if s.last_write is not None]
        return max(times) if times else None

    def rank_last_step(self) -> dict[int, int | None]:
        return {rank: s.last_step for rank, s in sorted(self._ranks.items())}

    def rank_last_write(self) -> dict[int, float | None]:
        return {rank: s.last_write for rank, s in sorted(self._ranks.items())}

    def rank_status(self) -> dict[int, str]:
        return {rank: s.status for rank, s in sorted(self._ranks.items())}

    @property
    def status(self) -> str:
        """As ``Run.status``: the most alarming state of any rank; damaged once done."""
        statuses = set(self.rank_status().values())
        status = next(
            (s for s in ("running", "interrupted", "stopped") if s in statuses), "finished"
        )
        if status != "running" and any(s.problems for s in self._ranks.values()):
            return "damaged"
        return status

    @property
    def alerts(self) -> list[dict[str, Any]]:
        """Every rank's own alerts (``alerts.jsonl``), each with its ``rank``."""
        out = []
        for rank, path in rank_dirs(self.path).items():
            for alert in read_jsonl(path / ALERTS):
                alert.setdefault("rank", rank)
                out.append(alert)
        return out

    @property
    def interventions(self) -> list[dict[str, Any]]:
        """Every rank's interventions (``interventions.jsonl``), each with its ``rank``,
        by time (as ``Run.interventions``)."""
        out = []
        for rank, path in rank_dirs(self.path).items():
            for item in read_jsonl(path / INTERVENTIONS):
                if item.get("rank") is None:
                    item["rank"] = rank
                out.append(item)
        return sorted(out, key=lambda item: float(item.get("time") or 0.0))

    @property
    def checkpoints(self) -> list[dict[str, Any]]:
        """Every rank's saved checkpoints, by step (as ``Run.checkpoints``)."""
        return checkpoint_files(self.path)

    @property
    def snapshots(self) -> list[dict[str, Any]]:
        return [snap for _, s in sorted(self._ranks.items()) for snap in s.own_snapshots()]


class RankView:
    """A frozen copy of what ``diagnose.ranks.rank_alerts`` reads from a run.

    Taken under the run's lock (references to arrays that are never modified), so the
    rules can run in another thread while the run keeps being refreshed. A rank served
    from its overview is decoded here, in the rules' thread, when first read (the rules
    need every step; the charts did not wait for it), and kept compact like a done rank.
    """

    def __init__(self, run: Any) -> None:
        self.ranks = list(run.ranks)
        self._series: dict[int, dict[str, Any]] = {}
        self._tags: dict[int, list[str]] = {}
        self._lazy: dict[int, Path] = {}
        self._pool: list[np.ndarray] = []
        lazy_dir = getattr(run, "overview_dir", None)
        for rank in self.ranks:
            try:
                tags = run.tags(rank=rank)
            except KeyError:
                tags = []
            self._tags[rank] = sorted(tags)
            path = lazy_dir(rank) if lazy_dir is not None and tags else None
            if path is not None:
                self._lazy[rank] = path
            else:
                self._series[rank] = {tag: run.scalars(tag, rank=rank) for tag in tags}
        self._last_step = dict(run.rank_last_step())
        self._last_write = dict(run.rank_last_write())
        self._status = dict(run.rank_status())

    def tags(self, rank: int | None = None) -> list[str]:
        return self._tags.get(self.ranks[0] if rank is None else rank, [])

    def scalars(self, tag: str, rank: int | None = None) -> Any:
        rank = self.ranks[0] if rank is None else rank
        if rank not in self._series:
            decoded = Run(self._lazy[rank])
            decoded.refresh()
            self._series[rank] = _compact_series(decoded, self._pool)
        return self._series[rank][tag]

    def rank_last_step(self) -> Mapping[int, int | None]:
        return self._last_step

    def rank_last_write(self) -> Mapping[int, float | None]:
        return self._last_write

    def rank_status(self) -> Mapping[int, str]:
        return self._status
