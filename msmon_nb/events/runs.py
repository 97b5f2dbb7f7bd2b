"""Runs on disk: discovery, incremental loading, series access and status.

A run is a directory holding summary files (``summary.<digits>`` in the name, MindSpore's
``_lineage`` side files excluded), our ``msmon_run.json`` marker, or ``rank_<k>/``
sub-directories with summary files; or msprobe monitor's CSV output (``events.msprobe``:
its values under our tags where they mean the same, the rest under ``msprobe/``). Files
of one rank are read in timestamp order; each file is tailed, so ``Run.refresh()`` costs
only what was appended.

Repeated steps (a restart from a checkpoint) follow TensorBoard's purge rule, per tag:
when a step is written that is not greater than a step written before it, every earlier
point with a step >= it is dropped. So for a repeated step the later write wins, and the
orphaned tail of the crashed attempt disappears. ``scalars(tag, raw=True)`` returns the
points in write order, untouched.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from msmon_nb.events import msprobe
from msmon_nb.events.bulk import BulkScalarDecoder
from msmon_nb.events.rankmerge import merge_ranks
from msmon_nb.events.reader import EventDecoder, Problem, RecordReader
from msmon_nb.rundir.layout import (
    ALERTS,
    INTERVENTIONS,
    MARKER,
    SNAPSHOTS,
    checkpoint_files,
    combined_status,
    find_run_dirs,
    is_run_dir,
    rank_markers,
    rank_of_dir,
    read_marker_file,
    read_run_jsonl,
    run_files,
    run_status,
    summary_file_key,
)

log = logging.getLogger(__name__)


class ScalarSeries(NamedTuple):
    """One scalar tag: numpy arrays sorted by step (after the purge rule)."""

    steps: np.ndarray  # int64
    values: np.ndarray  # float32, as stored in the file
    wall_times: np.ndarray  # float64


class MergedSeries(NamedTuple):
    """One tag across the ranks of a run: per step, the mean, min, max and how many ranks."""

    steps: np.ndarray
    mean: np.ndarray
    min: np.ndarray
    max: np.ndarray
    count: np.ndarray


class Point(NamedTuple):
    """One histogram, tensor or image at a step."""

    step: int
    wall_time: float
    value: Any


class _Growable:
    """Append-only columns kept as a list of numpy chunks, joined on demand."""

    __slots__ = ("_cache", "chunks", "count", "max_step", "went_back")

    def __init__(self) -> None:
        self.chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.count = 0
        self.max_step: int | None = None
        self.went_back = False
        self._cache: ScalarSeries | None = None

    def extend(self, steps: np.ndarray, values: np.ndarray, walls: np.ndarray) -> None:
        if not len(steps):
            return
        if self.max_step is not None and steps[0] <= self.max_step:
            self.went_back = True
        if len(steps) > 1 and not self.went_back and (np.diff(steps) <= 0).any():
            self.went_back = True
        top = int(steps.max())
        self.max_step = top if self.max_step is None else max(self.max_step, top)
        self.chunks.append((steps, values, walls))
        self.count += len(steps)
        self._cache = None

    def raw(self) -> ScalarSeries:
        if self._cache is None:
            if len(self.chunks) > 1:
                self.chunks = [tuple(np.concatenate(c) for c in zip(*self.chunks, strict=True))]
            if self.chunks:
                self._cache = ScalarSeries(*self.chunks[0])
            else:
                self._cache = ScalarSeries(
                    np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float64)
                )
        return self._cache

    def purged(self) -> ScalarSeries:
        series = self.raw()
        if not self.went_back:
            return series
        return purge(series)


def purge(series: ScalarSeries) -> ScalarSeries:
    """Apply the purge rule (module docstring) to points in write order; result sorted."""
    steps = series.steps
    if len(steps) < 2:
        return series
    later_min = np.minimum.accumulate(steps[::-1])[::-1]
    later_min = np.append(later_min[1:], np.iinfo(np.int64).max)
    keep = steps < later_min
    return ScalarSeries(steps[keep], series.values[keep], series.wall_times[keep])


@dataclass
class _FileState:
    reader: RecordReader
    rank: int


class _RankData:
    """Everything read for one rank."""

    def __init__(self) -> None:
        self.scalars: dict[str, _Growable] = {}
        self.other: dict[str, dict[str, list[Point]]] = {}  # kind -> tag -> points
        self.last_step: int | None = None
        self.last_wall: float | None = None
        self.bulk = BulkScalarDecoder()
        self.decoder = EventDecoder()
        self.bad_events: list[Problem] = []

    def _add_scalar_columns(self, tag: str, steps, values, walls) -> None:
        series = self.scalars.get(tag)
        if series is None:
            series = self.scalars[tag] = _Growable()
        series.extend(steps, values, walls)

    def ingest(self, path: Path, buf: bytes, base: int, starts: list[int], stops: list[int]):
        blocks, rest = self.bulk.decode(buf, starts, stops)
        pieces: dict[str, list[tuple[np.ndarray, ...]]] = {}
        for block in blocks:
            for j, tag in enumerate(block.tags):
                pieces.setdefault(tag, []).append(
                    (block.index, block.steps, block.values[:, j], block.walls)
                )
        for i in rest.tolist():
            offset = base + starts[i] - 12
            try:
                record = self.decoder.decode(offset, buf[starts[i] : stops[i]])
            except ValueError as exc:
                problem = Problem(str(path), offset, str(exc))
                self.bad_events.append(problem)
                log.warning("msmon: undecodable summary record in %s", problem)
                continue
            if record.step is None:
                continue
            for value in record.values:
                if value.kind == "scalar":
                    pieces.setdefault(value.tag, []).append(
                        (
                            np.array([i]),
                            np.array([record.step], np.int64),
                            np.array([value.value], np.float32),
                            np.array([record.wall_time]),
                        )
                    )
                else:
                    point = Point(record.step, record.wall_time, value.value)
                    self.other.setdefault(value.kind, {}).setdefault(value.tag, []).append(point)
            self._note(record.step, record.wall_time)
        for tag, parts in pieces.items():
            index, steps, values, walls = (np.concatenate(c) for c in zip(*parts, strict=True))
            if len(parts) > 1:
                order = np.argsort(index, kind="stable")
                steps, values, walls = steps[order], values[order], walls[order]
            self._add_scalar_columns(tag, steps, values, walls)
            self._note(int(steps[-1]), float(walls[-1]))

    def _note(self, step: int, wall: float) -> None:
        if self.last_wall is None or wall >= self.last_wall:
            self.last_wall = wall
            self.last_step = step


class AlertRecord(dict):
    """An alert read back from ``alerts.jsonl``: a dict whose keys are also attributes."""

    _ALIASES: ClassVar[dict[str, str]] = {
        "onset": "since_step",
        "onset_step": "since_step",
        "rule": "kind",
    }

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._ALIASES.get(name, name)]
        except KeyError:
            raise AttributeError(f"alert has no field {name!r}; fields: {sorted(self)}") from None


class TagList(list):
    """A run's scalar tags that can also be called as ``tags(kind, rank)``."""

    def __init__(self, tags: list[str], lookup: Callable[[str, int | None], list[str]]) -> None:
        super().__init__(tags)
        self._lookup = lookup

    def __call__(self, kind: str = "scalar", rank: int | None = None) -> list[str]:
        """Tags of one kind (scalar, histogram, tensor, image), of one rank if given."""
        return self._lookup(kind, rank)


class Run:
    """A run directory. Data loads on first use; ``refresh()`` reads what was appended."""

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        self._files: dict[Path, _FileState] = {}
        self._ranks: dict[int, _RankData] = {}
        self._loaded = False
        self.marker: dict[str, Any] | None = None
        self._read_marker()
        # msprobe's CSV dirs read as a run (detected by content, never for a dir of ours)
        self._msprobe: dict[int, Path] | None = None
        self._msprobe_readers: dict[int, msprobe.RankReader] = {}
        if self.marker is None and not run_files(self.path):
            self._msprobe = msprobe.rank_dirs(self.path)

    def __repr__(self) -> str:
        return f"Run({self.name!r}, path={str(self.path)!r})"

    # --- loading ----------------------------------------------------------------------

    def _read_marker(self) -> None:
        self.marker = read_marker_file(self.path / MARKER)

    def _discover(self) -> None:
        if self._msprobe is not None:
            return
        for path, rank in run_files(self.path):
            if path not in self._files:
                self._files[path] = _FileState(RecordReader(path), rank)

    def refresh(self, progress: Callable[[int, int], None] | None = None) -> bool:
        """Read new files and new records; True when anything new arrived.

        ``progress(bytes_read, bytes_to_read)`` is called after each batch, for callers
        that report long cold loads.
        """
        self._loaded = True
        if self._msprobe is not None:
            return self._refresh_msprobe()
        self._read_marker()
        self._discover()
        new = False
        todo, done = 0, 0
        if progress is not None:
            for path, state in self._files.items():
                try:
                    todo += max(0, path.stat().st_size - state.reader.offset)
                except OSError:
                    continue
        for path in sorted(self._files, key=summary_file_key):
            state = self._files[path]
            rank = self._ranks.setdefault(state.rank, _RankData())
            for buf, base, starts, stops in state.reader.batches():
                rank.ingest(path, buf, base, starts, stops)
                new = True
                if progress is not None:
                    done += len(buf)
                    progress(min(done, todo), todo)
        return new

    def _refresh_msprobe(self) -> bool:
        """Read what each msprobe rank added (``events.msprobe.RankReader``: new files
        appended, a changed one re-read and the rank rebuilt from what was parsed)."""
        self._msprobe = msprobe.rank_dirs(self.path) or self._msprobe or {}
        new = False
        for rank, path in self._msprobe.items():
            reader = self._msprobe_readers.get(rank)
            if reader is None or reader.path != path:
                reader = self._msprobe_readers[rank] = msprobe.RankReader(path)
            polled = reader.poll()
            if polled is None:
                continue
            whole, arrays = polled
            if whole or rank not in self._ranks:
                self._ranks[rank] = _RankData()
            data = self._ranks[rank]
            for tag, (steps, values, walls) in arrays.items():
                data._add_scalar_columns(tag, steps, values, walls)
                # rows carry no wall time (their file's mtime stands in): the last step
                # is the highest step written
                top = int(np.argmax(steps))
                if data.last_step is None or steps[top] > data.last_step:
                    data.last_step, data.last_wall = int(steps[top]), float(walls[top])
            new = True
        return new

    @property
    def is_msprobe(self) -> bool:
        """Whether the run is msprobe monitor's CSV output (``events.msprobe``)."""
        return self._msprobe is not None

    def _load(self) -> None:
        if not self._loaded:
            self.refresh()

    # --- access -----------------------------------------------------------------------

    @property
    def files(self) -> list[Path]:
        """Summary files of the run, in reading order (an msprobe run's CSV files)."""
        if self._msprobe is not None:
            return [f for d in self._msprobe.values() for f, _ in msprobe.csv_files(d)]
        self._discover()
        return sorted(self._files, key=summary_file_key)

    def files_with_ranks(self) -> list[tuple[Path, int]]:
        """(summary file, the rank that wrote it), in reading order; nothing is read
        (export streams the files itself)."""
        files = self.files
        return [(path, self._files[path].rank) for path in files]

    def file_ranks(self) -> list[int]:
        """Ranks that wrote files, from the file names alone (no data is read)."""
        if self._msprobe is not None:
            return sorted(self._msprobe) or [0]
        self._discover()
        return sorted({state.rank for state in self._files.values()}) or [0]

    @property
    def distributed(self) -> bool:
        """Whether the run was written by several processes (``rank_<k>`` dirs, or files
        of more than one rank)."""
        if self._msprobe is not None:
            return len(self._msprobe) > 1
        self._discover()
        return any(rank_of_dir(p.parent.name) is not None for p in self._files) or (
            len(self.file_ranks()) > 1
        )

    @property
    def ranks(self) -> list[int]:
        """Ranks that wrote files into the run (``[0]`` for single-process runs)."""
        self._load()
        return sorted(self._ranks) or [0]

    def _rank(self, rank: int | None) -> _RankData:
        self._load()
        if rank is None:
            rank = min(self._ranks) if self._ranks else 0
        data = self._ranks.get(rank)
        if data is None:
            if not self._ranks:
                return _RankData()
            raise KeyError(f"run {self.name!r} has no rank {rank}; ranks: {sorted(self._ranks)}")
        return data

    @property
    def tags(self) -> TagList:
        """Scalar tags, sorted; call it for another kind or rank: ``run.tags("histogram")``.

        Both spellings work (``"train/loss" in run.tags`` and ``run.tags()``) because
        ``/api/runs`` and ``msmon runs --json`` present tags as a field.
        """
        return TagList(self._tags("scalar", None), self._tags)

    def recorded_tags(self) -> list[str]:
        """Scalar tags in the order first recorded (file order, lowest rank first):
        ``tags`` is sorted, which loses the forward order of activations' modules (the
        heatmap's rows, ``metrics.charts``)."""
        self._load()
        seen: dict[str, None] = {}
        for rank in sorted(self._ranks):
            seen.update(dict.fromkeys(self._ranks[rank].scalars))
        return list(seen)

    def _tags(self, kind: str = "scalar", rank: int | None = None) -> list[str]:
        data = self._rank(rank)
        if kind == "scalar":
            return sorted(data.scalars)
        return sorted(data.other.get(kind, {}))

    @property
    def run_dir(self) -> Path:
        """The run directory (same as ``path``; the name ``Monitor.run_dir`` uses)."""
        return self.path

    def scalars(self, tag: str, rank: int | None = None, raw: bool = False) -> ScalarSeries:
        """``(steps, values, wall_times)`` of ``tag``, sorted by step (see the purge rule)."""
        data = self._rank(rank)
        series = data.scalars.get(tag)
        if series is None:
            raise KeyError(_unknown(tag, data.scalars, self.name))
        return series.raw() if raw else series.purged()

    def _points(self, kind: str, tag: str, rank: int | None) -> list[Point]:
        data = self._rank(rank)
        points = data.other.get(kind, {}).get(tag)
        if points is None:
            raise KeyError(_unknown(tag, data.other.get(kind, {}), self.name, kind))
        by_step: dict[int, Point] = {}
        for point in points:  # a repeated step: the later write wins
            by_step[point.step] = point
        return [by_step[s] for s in sorted(by_step)]

    def histograms(self, tag: str, rank: int | None = None) -> list[Point]:
        """Histogram points of ``tag`` (``value`` is a ``Histogram``), sorted by step."""
        return self._points("histogram", tag, rank)

    def tensors(self, tag: str, rank: int | None = None) -> list[Point]:
        """Tensor points of ``tag`` (``value`` is a numpy array), sorted by step."""
        return self._points("tensor", tag, rank)

    def images(self, tag: str, rank: int | None = None) -> list[Point]:
        """Image points of ``tag`` (``value`` is an ``ImageValue``), sorted by step."""
        return self._points("image", tag, rank)

    @property
    def num_points(self) -> int:
        """Scalar points stored (all tags, all ranks, before the purge rule)."""
        self._load()
        return sum(s.count for r in self._ranks.values() for s in r.scalars.values())

    @property
    def last_step(self) -> int | None:
        """Step of the most recent record (max over ranks)."""
        self._load()
        steps = [r.last_step for r in self._ranks.values() if r.last_step is not None]
        return max(steps) if steps else None

    @property
    def last_write(self) -> float | None:
        """Modification time of the newest file (seconds since the epoch)."""
        times = []
        for path in self.files:
            try:
                times.append(path.stat().st_mtime)
            except OSError:
                continue
        return max(times) if times else None

    @property
    def problems(self) -> list[Problem]:
        """Damaged spots found in the run's files."""
        self._load()
        found = [p for f in self._files.values() for p in f.reader.problems]
        return found + [p for r in self._ranks.values() for p in r.bad_events]

    @property
    def status(self) -> str:
        """running, finished, stopped, interrupted, or damaged."""
        self._load()
        status = self._base_status()
        if status != "running" and self.problems:
            return "damaged"
        return status

    def _base_status(self) -> str:
        if self._msprobe is not None:
            return msprobe.status(self.files, time.time())
        by_rank = self.rank_status()
        if by_rank:
            return combined_status(by_rank.values())
        return run_status(self.marker, self.files)

    @property
    def rank_markers(self) -> dict[int, dict[str, Any]]:
        """rank -> the ``msmon_run.json`` of ``rank_<k>/`` (distributed runs written by us)."""
        return rank_markers(self.path)

    def rank_status(self) -> dict[int, str]:
        """rank -> running/finished/stopped/interrupted, for runs with per-rank markers."""
        markers = self.rank_markers
        if not markers:
            return {}
        files: dict[int, list[Path]] = {}
        for path, state in self._files.items():
            files.setdefault(state.rank, []).append(path)
        return {rank: run_status(m, files.get(rank, [])) for rank, m in markers.items()}

    def rank_last_step(self) -> dict[int, int | None]:
        """rank -> the step of its most recent record."""
        self._load()
        return {rank: data.last_step for rank, data in sorted(self._ranks.items())}

    def rank_last_write(self) -> dict[int, float | None]:
        """rank -> the wall time of its most recent record."""
        self._load()
        return {rank: data.last_wall for rank, data in sorted(self._ranks.items())}

    def merged(self, tag: str) -> MergedSeries:
        """Mean, min and max of ``tag`` across ranks at each step any rank recorded: the
        mean is NaN where a rank's value is not finite, min and max are over the finite
        values (``events.rankmerge``, the viewer's merge too)."""
        self._load()
        ranks = sorted(r for r, data in self._ranks.items() if tag in data.scalars)
        if not ranks:
            known = {t for data in self._ranks.values() for t in data.scalars}
            raise KeyError(_unknown(tag, known, self.name))
        merged = merge_ranks([self._ranks[r].scalars[tag].purged() for r in ranks], ranks)
        return MergedSeries(merged.steps, merged.mean, merged.min, merged.max, merged.count)

    @property
    def alerts(self) -> list[dict[str, Any]]:
        """Alerts raised while the run trained, oldest first (``alerts.jsonl`` of every rank).

        Each: ``step``, ``since_step`` (onset), ``kind``, ``severity``, ``message``, ``tag``,
        ``value``, ``rank``, ``wall_time``; readable as ``alert["kind"]`` or ``alert.kind``
        like the live ``Monitor.alerts`` (``onset`` is an alias of ``since_step``).
        """
        return [AlertRecord(item) for item in read_run_jsonl(self.path, ALERTS)]

    @property
    def interventions(self) -> list[dict[str, Any]]:
        """What was done to the run while it trained, by time (``interventions.jsonl`` of
        every rank): each command or alert action that changes training.

        Each: ``step`` (the last step finished when it acted), ``time``, ``who``
        (``panel``, ``ctl``, ``viewer``, ``magic``, ``api``, ``alert action``), ``what``
        (``pause``, ``resume``, ``stop``, ``freq``, ``lr``, ``checkpoint``, ``skip``),
        ``arg``, ``ok``, ``message``, ``rank``; a checkpoint's ``path`` and ``bytes``.
        """
        items = read_run_jsonl(self.path, INTERVENTIONS)
        return sorted(items, key=lambda item: float(item.get("time") or 0.0))

    @property
    def checkpoints(self) -> list[dict[str, Any]]:
        """The checkpoints the ``checkpoint`` command or alert action saved into the run:
        ``{rank, step, path, bytes, time}`` by step (``mindspore.load_checkpoint`` reads
        each)."""
        return checkpoint_files(self.path)

    @property
    def snapshots(self) -> list[dict[str, Any]]:
        """Tensor snapshots (``snapshots.jsonl``), each with its stats and histogram.

        Each: ``step``, ``name``, ``reason``, ``shape``, ``dtype``, ``stats`` (min, max,
        mean, std, nan_count, inf_count...), ``histogram`` (a ``Histogram`` or None) and
        ``has_value`` (the raw tensor is stored under ``snap/<name>/value``).
        """
        entries = read_run_jsonl(self.path, SNAPSHOTS)
        if not entries:
            return []
        self._load()
        for entry in entries:
            rank = entry.get("rank")
            data = self._ranks.get(rank if rank is not None else min(self._ranks, default=0))
            hist = None
            if data is not None:
                points = data.other.get("histogram", {}).get(f"snap/{entry['name']}/hist", [])
                hist = next((p.value for p in points if p.step == entry["step"]), None)
                tensors = data.other.get("tensor", {}).get(f"snap/{entry['name']}/value", [])
                entry["has_value"] = any(p.step == entry["step"] for p in tensors)
            entry["histogram"] = hist
        return entries

    def snapshot_value(self, name: str, step: int, rank: int | None = None) -> np.ndarray | None:
        """The raw tensor stored by a snapshot, or None when only stats were kept."""
        data = self._rank(rank)
        for point in data.other.get("tensor", {}).get(f"snap/{name}/value", []):
            if point.step == step:
                return point.value
        return None

    def summary(self) -> dict[str, Any]:
        """What ``msmon runs`` prints about the run."""
        return {
            "name": self.name,
            "path": str(self.path),
            "tags": self.tags(),
            "points": self.num_points,
            "last_step": self.last_step,
            "last_write": self.last_write,
            "status": self.status,
            "ranks": self.ranks,
            "distributed": self.distributed,
            "rank_last_step": {str(k): v for k, v in self.rank_last_step().items()},
            "rank_status": {str(k): v for k, v in self.rank_status().items()},
            "problems": [str(p) for p in self.problems],
        }


def _unknown(tag: str, known: Iterable[str], run: str, kind: str = "scalar") -> str:
    names = sorted(known)
    return f"run {run!r} has no {kind} tag {tag!r}; it has: {', '.join(names) or 'none'}"


def load_run(path: str | os.PathLike[str]) -> Run:
    """The run at ``path`` (a run dir, or one summary file's directory), loaded."""
    p = Path(path)
    if p.is_file():
        p = p.parent
    if not p.is_dir():
        raise FileNotFoundError(f"no run at {str(path)!r}: not a directory")
    if not is_run_dir(p) and not msprobe.is_msprobe_run(p):
        raise FileNotFoundError(
            f"no run at {str(path)!r}: it holds no summary files "
            "(names with 'summary.<digits>'), no msmon_run.json and no msprobe monitor "
            "output (<kind>_<a>-<b>.csv files with a 'vpp_stage,name,step' header)"
        )
    run = Run(p)
    run.refresh()
    return run


def load_runs(base: str | os.PathLike[str]) -> list[Run]:
    """Every run under ``base``, MindSpore-written ones included, sorted by name."""
    base_path = Path(base)
    if not base_path.is_dir():
        raise FileNotFoundError(f"summary base dir {str(base)!r} does not exist")
    runs = []
    for path in all_run_dirs(base_path):
        rel = path.relative_to(base_path).as_posix()
        run = Run(path, name=rel if rel != "." else path.name)
        run.refresh()
        runs.append(run)
    return sorted(runs, key=lambda r: r.name)


def all_run_dirs(base: Path) -> list[Path]:
    """Run dirs under ``base``: ours and MindSpore's (``find_run_dirs``), then msprobe's
    outside them (``events.msprobe.find_runs``)."""
    found = find_run_dirs(base)
    for path in msprobe.find_runs(base):
        if not any(path == run or run in path.parents for run in found):
            found.append(path)
    return found
