"""The runs of one base dir as the viewer serves them.

Listing uses the cheap ``RunIndex`` (a few file reads per run), so a base dir of a hundred
long runs lists in well under a second. A run is fully loaded (``Run``) only when a
client asks for its data; from then on the watcher's ``poll()`` tails it, so requests
never read files and two requests never load the same run twice.

A distributed run laid out as ``rank_<k>/`` dirs is held as a ``RankedRun`` (``rankmerge.py``:
rank by rank, done ranks kept compact); any other run as a ``Run``. A big finished
single-process run is drawn from its writer's overview first, as the done ranks of a job
are (``rankmerge.done_overview``): a million steps are 180 MB of events, seconds to decode
before the first chart, and the unzoomed charts need a few thousand points; the first
request that needs its events (a zoom, its snapshots) loads it. Series merged across
ranks are computed once per run version and kept. Cross-rank alerts are evaluated by a
worker thread (``crossrank.py``) whenever a run with several ranks is loaded or grows.

Thread model: ``ThreadingHTTPServer`` runs one thread per connection plus the watcher
and the cross-rank worker. Each loaded run has its own lock, held while it is refreshed
or while a series is taken out of it; the arrays handed out are never modified
afterwards (new data is appended to new chunks), so downsampling and JSON encoding run
outside the lock.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msmon_nb.diagnose.rankrules import with_cross_rank
from msmon_nb.events.index import RunIndex, RunInfo
from msmon_nb.events.overview import Overview
from msmon_nb.events.rankmerge import Merged, merge_ranks
from msmon_nb.events.runs import Run
from msmon_nb.rundir import (
    ALERTS,
    INTERVENTIONS,
    SNAPSHOTS,
    file_signature,
    per_rank_files,
    rank_dirs,
)
from msmon_nb.viewer.crossrank import CrossRankAlerts
from msmon_nb.viewer.rankmerge import (
    RankedRun,
    RankView,
    done_overview,
    is_ranked,
    overview_points,
)

CROSS_RANK_WAIT = 1.0  # s an /api/alerts request waits for cross-rank rules in progress


PROGRESS_BYTES = 64 * 2**20  # cold loads larger than this report progress on the console


def load_progress(name: str, stream: Any = None, every: float = 1.0):
    """A ``Run.refresh`` progress callback printing ``loading NAME: 45% of 900 MB``.

    Quiet for small runs; at most one line a second, and one when done.
    """
    out = stream if stream is not None else sys.stderr
    state = {"last": 0.0, "started": time.monotonic()}

    def report(done: int, total: int) -> None:
        if total < PROGRESS_BYTES:
            return
        now = time.monotonic()
        if done < total and now - state["last"] < every:
            return
        state["last"] = now
        print(
            f"msmon view: loading {name}: {100 * done // total}% of {total / 2**20:.0f} MB "
            f"({now - state['started']:.1f} s)",
            file=out,
            flush=True,
        )

    return report


class UnknownRun(KeyError):
    """No run of that name under the base dir."""


@dataclass
class _Loaded:
    run: Run | RankedRun
    lock: threading.Lock = field(default_factory=threading.Lock)
    loaded: bool = False
    signature: tuple = ()
    version: int = 0  # bumped whenever the run's data or status changes
    # while not loaded, a finished single-process run's overview (or None when it has no
    # usable one), with the listing's signature it was read at
    cold: tuple[tuple, Overview | None] | None = None
    merged: dict[str, tuple[int, Merged]] = field(default_factory=dict)


class RunStore:
    """Run listing and run data of one base dir; safe to use from many threads."""

    def __init__(self, base: str | Path) -> None:
        self.base = Path(base)
        self.index = RunIndex(self.base)
        self._index_lock = threading.Lock()
        self._lock = threading.Lock()
        self._loaded: dict[str, _Loaded] = {}
        self._infos: dict[str, RunInfo] = {}
        self._side_files: dict[str, tuple] = {}
        self._polled: dict[str, RunInfo] = {}  # what the last poll() saw, for its diffs
        self._events: list[tuple[str, dict[str, Any]]] = []  # raised between polls
        self.cross_rank = CrossRankAlerts(self._cross_rank_changed)

    def close(self) -> None:
        """Stop the cross-rank worker."""
        self.cross_rank.close()

    def _cross_rank_changed(self, name: str) -> None:
        with self._lock:
            self._events.append(("alerts", {"run": name}))

    # --- listing ----------------------------------------------------------------------

    def scan(self) -> list[RunInfo]:
        """Rescan the base dir (cheap once warm) and remember what was found."""
        with self._index_lock:
            infos = self.index.scan()
        with self._lock:
            self._infos = {i.name: i for i in infos}
        return infos

    def list_runs(self) -> list[dict[str, Any]]:
        """``/api/runs``: one dict per run; exact data for runs already loaded."""
        out = []
        for info in self.scan():
            entry = self._loaded_entry(info.name)
            if entry is not None and entry.loaded:
                with entry.lock:
                    run = entry.run
                    item = {
                        "name": info.name,
                        "path": info.path,
                        "tags": run.tags(),
                        "last_step": run.last_step,
                        "status": run.status,
                        "ranks": run.ranks,
                        "last_write": run.last_write,
                        "exact": True,
                        "rank_last_step": _str_keys(run.rank_last_step()),
                        "rank_status": _str_keys(run.rank_status()),
                    }
            else:
                item = {
                    "name": info.name,
                    "path": info.path,
                    "tags": list(info.tags),
                    "last_step": info.last_step,
                    "status": info.status,
                    "ranks": list(info.ranks),
                    "last_write": info.last_write,
                    "exact": info.exact,
                    "rank_last_step": _str_keys(info.rank_last_step),
                    "rank_status": _str_keys(info.rank_status),
                }
            out.append(item)
        return out

    def _loaded_entry(self, name: str) -> _Loaded | None:
        with self._lock:
            return self._loaded.get(name)

    # --- one run ----------------------------------------------------------------------

    def _entry(self, name: str) -> _Loaded:
        with self._lock:
            entry = self._loaded.get(name)
            info = self._infos.get(name)
        if entry is not None:
            return entry
        if info is None:  # maybe created since the last scan
            self.scan()
            with self._lock:
                info = self._infos.get(name)
        if info is None:
            raise UnknownRun(name)
        path = Path(info.path)
        run = RankedRun(path, name=name) if is_ranked(path) else Run(path, name=name)
        with self._lock:
            entry = self._loaded.setdefault(name, _Loaded(run))
        return entry

    def run_dir(self, name: str) -> Path:
        """The directory of run ``name``, proven to lie inside the base dir (links
        resolved); ``UnknownRun`` for a name the listing does not have."""
        with self._lock:
            info = self._infos.get(name)
        if info is None:
            self.scan()
            with self._lock:
                info = self._infos.get(name)
        if info is None:
            raise UnknownRun(name)
        path, base = Path(info.path).resolve(), self.base.resolve()
        if path != base and base not in path.parents:
            raise UnknownRun(name)
        return path

    def run(self, name: str) -> _Loaded:
        """The loaded run ``name`` (loading it on first use); raises ``UnknownRun``."""
        entry = self._entry(name)
        if not entry.loaded:
            with entry.lock:
                if not entry.loaded:
                    if isinstance(entry.run, Run):
                        entry.run.refresh(progress=load_progress(name))
                    else:
                        entry.run.refresh()
                    entry.loaded = True
                    entry.cold = None
                    entry.version += 1
                    with self._lock:
                        info = self._infos.get(name)
                    entry.signature = info.signature if info else ()
                    self._submit_cross_rank(name, entry)
        return entry

    def _submit_cross_rank(self, name: str, entry: _Loaded) -> None:
        """Queue the cross-rank rules for the run's current version (hold ``entry.lock``)."""
        if len(entry.run.ranks) > 1:
            self.cross_rank.submit(name, entry.version, RankView(entry.run))

    def scalars(
        self, name: str, tag: str, rank: int | None = None, exact: bool = False
    ) -> tuple[int, Any]:
        """The rank served and its series of ``tag`` (``.steps``, ``.values``; KeyError
        naming the known tags); ``rank=None`` serves the lowest rank, and says which
        (under the run's lock: the ranks may grow between two calls); ``exact``: never
        from an overview (a zoom asks for raw points)."""
        if not exact:
            cold = self._cold(name, rank)
            if cold is not None:
                served, overview = cold
                points = overview_points(overview, tag)
                if points is None:
                    known = ", ".join(sorted(overview.tags)) or "none"
                    raise KeyError(f"run {name!r} has no scalar tag {tag!r}; it has: {known}")
                return served, points
        entry = self.run(name)
        with entry.lock:
            served = min(entry.run.ranks) if rank is None else rank
            if isinstance(entry.run, RankedRun):
                return served, entry.run.scalars(tag, rank=rank, exact=exact)
            return served, entry.run.scalars(tag, rank=rank)

    def recorded_tags(self, name: str) -> list[str]:
        """Run ``name``'s scalar tags in the order first recorded (a heatmap's rows:
        forward order); [] where unknown (a job of ranks). A run still drawn from its
        overview answers from it (its tags are in write order) without being decoded."""
        cold = self._cold(name, None)
        if cold is not None:
            return list(cold[1].tags)
        entry = self.run(name)
        with entry.lock:
            order = getattr(entry.run, "recorded_tags", None)
            return order() if order is not None else []

    def _cold(self, name: str, rank: int | None) -> tuple[int, Overview] | None:
        """``(rank, overview)`` while run ``name`` is a finished single-process run, not
        loaded, whose writer's overview can serve its unzoomed charts; else None."""
        entry = self._entry(name)
        with self._lock:
            info = self._infos.get(name)
        if entry.loaded or not isinstance(entry.run, Run) or info is None:
            return None
        served = info.ranks[0] if info.ranks else 0
        if len(info.ranks) > 1 or (rank is not None and rank != served):
            return None
        with entry.lock:
            if entry.loaded:
                return None
            if entry.cold is None or entry.cold[0] != info.signature:
                path = Path(info.path)
                done = None if rank_dirs(path) else done_overview(path)
                entry.cold = (info.signature, done[0] if done else None)
            overview = entry.cold[1]
        return None if overview is None else (served, overview)

    def merged(self, name: str, tag: str, exact: bool = False) -> Merged:
        """``tag`` merged across the run's ranks (computed once per run version);
        ``exact``: from decoded points, never from overview blocks."""
        entry = self.run(name)
        with entry.lock:
            key = (tag, exact)
            cached = entry.merged.get(key)
            if cached is not None and cached[0] == entry.version:
                return cached[1]
            run = entry.run
            if isinstance(run, RankedRun):
                merged = run.merged(tag, exact=exact)
            else:
                ranks = [r for r in run.ranks if tag in _tags(run, r)]
                if not ranks:
                    known = sorted({t for r in run.ranks for t in _tags(run, r)})
                    raise KeyError(
                        f"run {name!r} has no scalar tag {tag!r} on any rank; "
                        f"it has: {', '.join(known) or 'none'}"
                    )
                merged = merge_ranks([run.scalars(tag, rank=r) for r in ranks], ranks)
            entry.merged[key] = (entry.version, merged)
            return merged

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """The run's own alerts and, for several ranks, the cross-rank ones, by step.

        Own alerts are read from disk each time (the files are small and appended);
        cross-rank ones (``cross_rank: true``) are the worker's latest result, waited for
        up to ``CROSS_RANK_WAIT`` s, so for a big job they may appear later (an
        ``alerts`` event says when).
        """
        entry = self._entry(name)
        with self._lock:
            info = self._infos.get(name)
        several = len(entry.run.ranks) > 1 if entry.loaded else bool(info and len(info.ranks) > 1)
        own = entry.run.alerts
        if not several:
            return own
        self.run(name)  # loading queues the cross-rank rules
        self.cross_rank.wait(name, CROSS_RANK_WAIT)
        return sorted(with_cross_rank(own, self.cross_rank.get(name)), key=_step_key)

    def interventions(self, name: str) -> list[dict[str, Any]]:
        """What was done to the run (every rank's ``interventions.jsonl``), by time: read
        from disk each time, like the own alerts (small, appended files)."""
        return self._entry(name).run.interventions

    def checkpoints(self, name: str) -> list[dict[str, Any]]:
        """The run's saved checkpoints (every rank's), by step, with their sizes."""
        return self._entry(name).run.checkpoints

    def snapshots(self, name: str) -> list[dict[str, Any]]:
        """The run's tensor snapshots with their stats and histograms."""
        entry = self._entry(name)
        if not entry.loaded and not _any_file(per_rank_files(entry.run.path, SNAPSHOTS)):
            return []  # none taken: no reason to decode the run (a page asks on opening it)
        entry = self.run(name)
        with entry.lock:
            return entry.run.snapshots

    # --- watching ---------------------------------------------------------------------

    def poll(self) -> list[tuple[str, dict[str, Any]]]:
        """Rescan, tail loaded runs that changed; returns the events to broadcast.

        Events: ``("runs", {names})`` when runs appear, vanish or change status;
        ``("data", {run, last_step})`` when a run's files grew; ``("alerts", {run})``
        when its alerts or snapshots files changed.
        """
        before = self._polled
        infos = {i.name: i for i in self.scan()}
        self._polled = infos
        events: list[tuple[str, dict[str, Any]]] = []
        listed = {n: (i.status, i.rank_status) for n, i in infos.items()}
        if listed != {n: (i.status, i.rank_status) for n, i in before.items()}:
            events.append(("runs", {"names": sorted(infos)}))
        with self._lock:
            for gone in set(self._loaded) - set(infos):
                del self._loaded[gone]
                self.cross_rank.forget(gone)
        for gone in set(self._side_files) - set(infos):
            del self._side_files[gone]
        for name, info in infos.items():
            old = before.get(name)
            entry = self._loaded_entry(name)
            changed = old is not None and old.signature[0] != info.signature[0]
            if entry is not None and entry.loaded and entry.signature != info.signature:
                with entry.lock:
                    grew = entry.run.refresh()
                    entry.signature = info.signature
                    entry.version += 1
                    last_step = entry.run.last_step
                    self._submit_cross_rank(name, entry)
                if grew:
                    events.append(("data", {"run": name, "last_step": last_step}))
            elif changed:
                events.append(("data", {"run": name, "last_step": info.last_step}))
            side = _side_signature(Path(info.path))
            if self._side_files.get(name, side) != side:
                events.append(("alerts", {"run": name}))
            self._side_files[name] = side
        with self._lock:
            raised, self._events = self._events, []
        return events + [e for e in raised if e not in events]


def _str_keys(by_rank: dict[int, Any]) -> dict[str, Any]:
    """JSON object keys are strings: ``{0: x}`` -> ``{"0": x}``, ranks in order."""
    return {str(k): v for k, v in sorted(by_rank.items())}


def _tags(run: Run | RankedRun, rank: int) -> list[str]:
    try:
        return run.tags(rank=rank)
    except KeyError:
        return []


def _step_key(alert: dict[str, Any]) -> int:
    step = alert.get("step")
    return step if isinstance(step, int) else -1


def _any_file(paths: list[Path]) -> bool:
    """True when any of ``paths`` is a file with something in it."""
    for path in paths:
        try:
            if path.stat().st_size:
                return True
        except OSError:
            continue
    return False


def _side_signature(run_dir: Path) -> tuple:
    """Sizes and mtimes of the run's alerts, snapshots and interventions files (all
    ranks): a change is announced as an ``alerts`` event."""
    return file_signature(
        path
        for name in (ALERTS, SNAPSHOTS, INTERVENTIONS)
        for path in per_rank_files(run_dir, name)
    )
