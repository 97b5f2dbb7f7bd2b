"""A run dir's overview: per tag, one row per block of ``BLOCK`` consecutive scalars.

Why: a 64-rank x 100,000-step job is ~900 MiB of summary files; drawing its merged chart
from them means decoding every record (about 10 s on a laptop core), while the chart needs
a few hundred points per rank. So ``EventWriter`` builds this index while it writes, in
its own thread: for every tag, each block of ``BLOCK`` scalars in write order becomes one
fixed-size row (its first/last step, its min and max with their steps, the sum and count
of its finite values, how many NaN/Inf it held and the first such step). Rows are appended
to ``msmon_overview.bin`` at each flush; ``msmon_overview.json`` names the tags (row
``tag`` is an index into it) and, once the writer closed, the event files and the sizes
the overview covers. A reader trusts an overview only when it is *complete*, those files
are all the dir's summary files and still have those sizes (nothing appended, truncated,
rewritten or written by another writer since), and else decodes the events as before.
A tag's last block may hold fewer than ``BLOCK`` scalars.

A block's min and max points keep every spike (the viewer's min/max decimation needs no
more), and its sum/count gives the block mean for a merged line; 104 bytes a row, 1.6
bytes a scalar at ``BLOCK`` = 64.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from msmon_nb.rundir import OVERVIEW_DATA, OVERVIEW_INDEX, is_summary_file

BLOCK = 64  # scalars per row
ROW = np.dtype(
    [
        ("tag", "<u4"),
        ("n", "<u4"),  # scalars in the block
        ("first_step", "<i8"),
        ("last_step", "<i8"),
        ("min_step", "<i8"),
        ("max_step", "<i8"),
        ("min", "<f8"),  # +inf when the block holds no finite value
        ("max", "<f8"),  # -inf likewise
        ("sum", "<f8"),  # of the finite values
        ("finite", "<u4"),
        ("nonfinite", "<u4"),
        ("nonfinite_step", "<i8"),  # the first NaN/Inf's step, -1 when none
        ("nonfinite_value", "<f8"),  # and that value (nan, inf or -inf)
        ("first_value", "<f8"),  # the series' first and last points stay exact
        ("last_value", "<f8"),
    ]
)


def _rows(tag: int, steps: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Rows for ``steps``/``values`` cut into blocks of ``size`` (the last may be shorter)."""
    n = len(steps)
    count = -(-n // size)
    pad = count * size - n
    s = np.concatenate([steps, np.full(pad, steps[-1])]).reshape(count, size)
    v = np.concatenate([values, np.full(pad, np.nan)]).reshape(count, size)
    real = np.arange(count * size).reshape(count, size) < n
    finite = np.isfinite(v) & real
    bad = ~np.isfinite(v) & real
    lo = np.where(finite, v, np.inf)
    hi = np.where(finite, v, -np.inf)
    r = np.arange(count)
    out = np.zeros(count, dtype=ROW)
    out["tag"] = tag
    out["n"] = real.sum(axis=1)
    out["first_step"] = s[:, 0]
    last = out["n"] - 1
    out["last_step"] = s[r, last]
    out["min_step"], out["min"] = s[r, lo.argmin(axis=1)], lo.min(axis=1)
    out["max_step"], out["max"] = s[r, hi.argmax(axis=1)], hi.max(axis=1)
    out["sum"] = np.where(finite, v, 0.0).sum(axis=1)
    out["finite"] = finite.sum(axis=1)
    out["nonfinite"] = bad.sum(axis=1)
    first_bad = bad.argmax(axis=1)
    has_bad = bad.any(axis=1)
    out["nonfinite_step"] = np.where(has_bad, s[r, first_bad], -1)
    out["nonfinite_value"] = np.where(has_bad, v[r, first_bad], 0.0)
    out["first_value"] = v[:, 0]
    out["last_value"] = v[r, last]
    return out


@dataclass
class OverviewWriter:
    """Fed by the writer thread (``add``: two list appends a scalar); ``flush`` turns the
    full blocks into rows with numpy and appends them to the file."""

    run_dir: Path
    tags: list[str] = field(default_factory=list)
    _ids: dict[str, int] = field(default_factory=dict)
    _pending: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)
    _tags_written: int = -1
    rows_written: int = 0

    def __post_init__(self) -> None:
        # a new writer starts a new overview: one left by an earlier writer in this dir
        # (a restart) covered other files
        for name in (OVERVIEW_DATA, OVERVIEW_INDEX):
            try:
                (self.run_dir / name).unlink()
            except OSError:
                pass

    def add(self, step: int, items: tuple[tuple[str, float], ...]) -> None:
        for tag, value in items:
            tid = self._ids.get(tag)
            if tid is None:
                tid = self._ids[tag] = len(self.tags)
                self.tags.append(tag)
                self._pending[tid] = ([], [])
            steps, values = self._pending[tid]
            steps.append(step)
            values.append(value)

    def flush(self, files: list[tuple[str, int]] | None = None) -> None:
        """Append the rows of full blocks; with ``files`` (at close), of the partial last
        blocks too, and mark the overview complete over those ``(file name, size)``."""
        parts = []
        for tid, (steps, values) in self._pending.items():
            full = len(steps) if files is not None else len(steps) // BLOCK * BLOCK
            if not full:
                continue
            parts.append(_rows(tid, np.array(steps[:full], dtype=np.int64),
                               np.array(values[:full], dtype=np.float64), BLOCK))  # fmt: skip
            del steps[:full], values[:full]
        if parts:
            rows = np.concatenate(parts)
            with open(self.run_dir / OVERVIEW_DATA, "ab") as out:
                out.write(rows.tobytes())
            self.rows_written += len(rows)
        if files is not None or len(self.tags) != self._tags_written:
            self._tags_written = len(self.tags)
            index: dict[str, Any] = {"version": 1, "block": BLOCK, "tags": self.tags}
            if files is not None:
                index.update(complete=True, rows=self.rows_written, files=files)
            tmp = self.run_dir / (OVERVIEW_INDEX + ".tmp")
            tmp.write_text(json.dumps(index))
            tmp.replace(self.run_dir / OVERVIEW_INDEX)


@dataclass
class Overview:
    """A complete overview of one run dir: its tags and rows (``ROW``)."""

    tags: list[str]
    rows: np.ndarray

    def tag_rows(self, tag: str) -> np.ndarray | None:
        """The rows of ``tag`` in write order (None when the run never wrote it)."""
        try:
            tid = self.tags.index(tag)
        except ValueError:
            return None
        return self.rows[self.rows["tag"] == tid]


def read_overview(run_dir: Path) -> Overview | None:
    """The run dir's overview if complete and still true of its event files, else None."""
    try:
        index = json.loads((run_dir / OVERVIEW_INDEX).read_text())
        if not index.get("complete") or index.get("version") != 1:
            return None
        # every summary file of the dir, no more, no fewer (another writer's, a restart's)
        present = {p.name for p in run_dir.iterdir() if is_summary_file(p.name)}
        if present != {name for name, _ in index["files"]}:
            return None
        for name, size in index["files"]:
            if (run_dir / name).stat().st_size != size:
                return None
        rows = np.fromfile(run_dir / OVERVIEW_DATA, dtype=ROW)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(rows) != index["rows"]:
        return None
    return Overview(list(index["tags"]), rows)


def points(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each block's min and max as points in step order (one point when they coincide),
    and its first non-finite value at its step: what the min/max decimation of the
    series would keep of it anyway."""
    ok = rows["finite"] > 0
    min_first = rows["min_step"] <= rows["max_step"]
    a_step = np.where(min_first, rows["min_step"], rows["max_step"])
    a_val = np.where(min_first, rows["min"], rows["max"])
    b_step = np.where(min_first, rows["max_step"], rows["min_step"])
    b_val = np.where(min_first, rows["max"], rows["min"])
    bad = rows["nonfinite"] > 0
    two = ok & (b_step != a_step)
    ends = rows[[0, -1]] if len(rows) else rows[:0]
    steps = np.concatenate(
        [a_step[ok], b_step[two], rows["nonfinite_step"][bad], ends["first_step"][:1],
         ends["last_step"][1:]]
    )  # fmt: skip
    values = np.concatenate(
        [a_val[ok], b_val[two], rows["nonfinite_value"][bad], ends["first_value"][:1],
         ends["last_value"][1:]]
    )  # fmt: skip
    steps, first = np.unique(steps, return_index=True)  # sorted, each step once
    return steps.astype(np.int64), values[first]
