"""msprobe monitor output read as a run: its CSV files mapped onto our tags.

msprobe's ``TrainerMon`` (mindstudio-probe, the Ascend toolkit's monitor) writes, per rank,
a dir ``<time>-rank<k>-<id>/`` of CSV files ``<kind>_<first>-<last>.csv`` (one per kind and
window of ``step_count_per_record`` steps) whose header is ``vpp_stage,name,step[,micro_step],
<op>...``. A user who ran it on an Ascend job should see that output in our charts, so
``Run`` reads such a dir through this module; nothing here imports msprobe.

Detection is by content only: a dir is msprobe's when it holds a CSV whose name has the
``<kind>_<a>-<b>.csv`` form and whose header starts ``vpp_stage,name,step``. A dir holding
such rank dirs (names with ``-rank<k>-``) is one run with those ranks (the
``MONITOR_OUTPUT_DIR`` of one job), unless two of them claim the same rank (two jobs wrote
there): then each rank dir is a run of its own.

Where msprobe measures what one of our tags means, its value goes under our tag
(``MAPPED``); every other column is kept as ``msprobe/<kind>/<name>/<op>``. Its zeros
(share of ``|x| < eps``) and nans (NaN only) are not our ``zero_frac`` (``== 0``) and
``nonfinite`` (NaN and Inf), so they stay under ``msprobe/``. msprobe records no wall time:
each row gets its file's modification time.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from msmon_nb.rundir import walk_runs

CSV_RE = re.compile(r"^([a-z][a-z0-9_]*)_(\d+)-(\d+)\.csv$")
HEADER_START = ("vpp_stage", "name", "step")
RANK_RE = re.compile(r"-rank(\d{1,5})-")
PREFIX = "msprobe"
RECENT_SECS = 60.0  # msprobe writes no marker: a run is running if it wrote this recently

# msprobe kind -> (our stat prefix, step shift) for the kinds that mean what ours do:
#   gradients after the data-parallel reduce (what our grad stats are), the weights after
#   the step's update (ours are read at the step's end), Adam's first and second moments.
#   msprobe reads the moments in a hook before the optimizer runs, so its step k holds the
#   state after update k - 1: our step k - 1 (its step 0, the zeros before any update,
#   has no step of ours and stays under msprobe/ only).
_PARAM_KINDS = {
    "grad_reduced": ("grad", 0),
    "param_updated": ("weight", 0),
    "exp_avg": ("moment1", -1),
    "exp_avg_sq": ("moment2", -1),
}
# module activations (forward output) and their gradients (gradient of that output)
_ACT_KINDS = {"actv": "act", "actv_grad": "act_grad"}
# what each mapped family takes: msprobe op -> our stat; max_abs = max(|min|, |max|)
MAPPED = {
    "param": {"norm": "norm"},
    "act": {"norm": "norm", "mean": "mean"},
}
_NOT_NUMBERS = frozenset({"shape", "dtype", "id"})
_TAG_BAD = re.compile(r"[^a-z0-9_.\-]+")


def tag_part(text: str) -> str:
    """``text`` as one group of a tag (lowercase ASCII, ``[a-z0-9_.-]``): msprobe names
    (``0:Fc1.weight``, ``exp_avg.fc1.weight``) become legal tag groups."""
    cleaned = _TAG_BAD.sub("_", text.encode("ascii", "ignore").decode().lower()).strip("_")
    return cleaned or "x"


# files whose header was proven msprobe's, by (path, inode): msprobe writes a file per
# kind and window (per step by default: 1,600 files for 200 steps), and the viewer lists
# runs every second, so each header is read once
_PROVEN: set[tuple[str, int]] = set()
_PROVEN_MAX = 500_000


def _proven(entry: os.DirEntry) -> bool:
    try:
        key = (entry.path, entry.inode())
    except OSError:
        return False
    if key in _PROVEN:
        return True
    if _header(Path(entry.path)) is None:
        return False
    if len(_PROVEN) >= _PROVEN_MAX:
        _PROVEN.clear()
    _PROVEN.add(key)
    return True


def _header(path: Path) -> list[str] | None:
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            first = fh.readline(4096)
    except (OSError, UnicodeDecodeError):
        return None
    row = next(csv.reader([first]), [])
    return row if tuple(row[:3]) == HEADER_START else None


def has_csv(path: Path) -> bool:
    """Whether ``path`` holds one msprobe CSV (stops at the first: detection only)."""
    try:
        with os.scandir(path) as entries:
            return any(CSV_RE.match(e.name) and e.is_file() and _proven(e) for e in entries)
    except OSError:
        return False


def csv_files(path: Path) -> list[tuple[Path, str]]:
    """msprobe's CSV files directly in ``path`` with their kind (``actv``, ``exp_avg``...),
    proven by their header; by kind, then window."""
    found = []
    try:
        entries = list(os.scandir(path))
    except OSError:
        return found
    for entry in entries:
        match = CSV_RE.match(entry.name)
        if match and entry.is_file() and _proven(entry):
            found.append((Path(entry.path), match.group(1), int(match.group(2))))
    found.sort(key=lambda item: (item[1], item[2], item[0].name))
    return [(p, kind) for p, kind, _ in found]


def _rank_of(name: str) -> int | None:
    match = RANK_RE.search(name)
    return int(match.group(1)) if match else None


def rank_dirs(path: str | os.PathLike[str]) -> dict[int, Path] | None:
    """rank -> msprobe rank dir of the run at ``path``, or None when it is not msprobe's.

    ``path`` is a rank dir itself (its rank from its name, else 0) or the output dir of
    one job holding rank dirs with distinct ranks (module docstring).
    """
    p = Path(path)
    if has_csv(p):
        return {_rank_of(p.name) or 0: p}
    subs = _rank_subdirs(p)
    ranks = [rank for rank, _ in subs]
    if not subs or len(set(ranks)) != len(ranks):
        return None
    return dict(sorted(subs))


def _rank_subdirs(path: Path) -> list[tuple[int, Path]]:
    try:
        entries = [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    out = []
    for entry in sorted(entries, key=lambda e: e.name):
        rank = _rank_of(entry.name)
        if rank is not None and has_csv(Path(entry.path)):
            out.append((rank, Path(entry.path)))
    return out


def is_msprobe_run(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is an msprobe output dir that reads as a run."""
    return rank_dirs(path) is not None


def find_runs(base: str | os.PathLike[str], max_depth: int = 4) -> list[Path]:
    """msprobe runs under ``base`` (itself included), not descending into them."""

    def take(path: Path) -> list[Path] | None:
        if is_msprobe_run(path):
            return [path]
        ranked = _rank_subdirs(path)  # rank dirs of several jobs in one dir: one run each
        return [p for _, p in ranked] if ranked else None

    return walk_runs(base, take, max_depth)


@dataclass
class Columns:
    """One rank's series as read: tag -> (steps, values, wall times) lists."""

    series: dict[str, tuple[list[int], list[float], list[float]]] = field(default_factory=dict)

    def add(self, tag: str, step: int, value: float, wall: float) -> None:
        steps, values, walls = self.series.setdefault(tag, ([], [], []))
        steps.append(step)
        values.append(value)
        walls.append(wall)

    def arrays(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return {
            tag: (np.asarray(s, np.int64), np.asarray(v, np.float32), np.asarray(w, np.float64))
            for tag, (s, v, w) in self.series.items()
        }


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _row_fields(row: list[str], header: list[str]) -> tuple[str, str, int, int, dict[str, str]]:
    """(vpp_stage, name, step, micro_step, {op: text}) of one row.

    msprobe 26.2.0 writes its moment rows (``exp_avg``, ``exp_avg_sq``) without the
    ``vpp_stage`` field (their names carry no ``<stage>:``), so such a row is one field
    short and its step sits third: ``exp_avg.fc1.weight,<norm>,<step>,<min>,...``.
    """
    micro = header[3] == "micro_step"
    ops = header[4:] if micro else header[3:]
    if len(row) == len(header) - 1 and not row[0].lstrip("-").isdigit():
        name, step = row[0], row[2]
        values = [row[1], *row[3:]]
        return "0", name, int(float(step)), 0, dict(zip(ops, values, strict=False))
    step = int(float(row[2]))
    micro_step = int(float(row[3])) if micro else 0
    values = row[4:] if micro else row[3:]
    return row[0], row[1], step, micro_step, dict(zip(ops, values, strict=False))


def _names(kind: str, stage: str, name: str) -> tuple[str, str]:
    """(our name part, the module's side ``input``/``output`` or ``''``) of a row."""
    if kind in ("exp_avg", "exp_avg_sq") and name.startswith(kind + "."):
        name = name[len(kind) + 1 :]
    side = ""
    if kind in _ACT_KINDS:
        base, dot, last = name.rpartition(".")
        if dot and last in ("input", "output"):
            name, side = base, last
    part = tag_part(name)
    if stage not in ("", "0"):  # a virtual pipeline stage's chunk: its own series
        part = f"chunk{tag_part(stage)}.{part}"
    return part, side


def read_file(path: Path, kind: str, out: Columns) -> None:
    """Append the series of one msprobe CSV to ``out`` (mapping in the module docstring);
    a row that cannot be read is skipped (the reader never raises on user data)."""
    try:
        wall = path.stat().st_mtime
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if not header or tuple(header[:3]) != HEADER_START:
        return
    for row in rows:
        try:
            stage, name, step, micro, ops = _row_fields(row, header)
        except (IndexError, ValueError):
            continue
        _add_row(kind, stage, name, step, micro, ops, wall, out)


def _add_row(
    kind: str,
    stage: str,
    name: str,
    step: int,
    micro: int,
    ops: dict[str, str],
    wall: float,
    out: Columns,
) -> None:
    part, side = _names(kind, stage, name)
    numbers = {op: _number(text) for op, text in ops.items() if op not in _NOT_NUMBERS}
    ours, at = None, step
    if kind in _PARAM_KINDS:
        stat, shift = _PARAM_KINDS[kind]
        ours, at = (f"param/{part}/{stat}_", MAPPED["param"]), step + shift
    elif kind in _ACT_KINDS and side == "output" and micro == 0:
        ours = (f"{_ACT_KINDS[kind]}/{part}/", MAPPED["act"])
    kept = f"{part}.{side}" if side else part
    if micro:
        kept += f"/micro{micro}"
    for op, value in numbers.items():
        if ours is not None and op in ours[1]:
            if at >= 0:
                out.add(ours[0] + ours[1][op], at, value, wall)
            else:  # no step of ours: kept as msprobe wrote it
                out.add(f"{PREFIX}/{tag_part(kind)}/{kept}/{tag_part(op)}", step, value, wall)
        else:
            out.add(f"{PREFIX}/{tag_part(kind)}/{kept}/{tag_part(op)}", step, value, wall)
    if ours is not None and at >= 0 and "min" in numbers and "max" in numbers:
        low, high = numbers["min"], numbers["max"]
        extent = math.nan if math.isnan(low) or math.isnan(high) else max(abs(low), abs(high))
        out.add(ours[0] + "max_abs", at, extent, wall)


Arrays = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]


def read_rank(path: Path) -> Arrays:
    """Every series of one msprobe rank dir: tag -> (steps, values, wall times), in the
    order written (windows in step order; ``Run`` sorts and applies the purge rule)."""
    out = Columns()
    for file, kind in csv_files(path):
        read_file(file, kind, out)
    return out.arrays()


def _joined(parts: list[Arrays]) -> Arrays:
    pieces: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for part in parts:
        for tag, columns in part.items():
            pieces.setdefault(tag, []).append(columns)
    return {
        tag: tuple(np.concatenate(c) for c in zip(*cols, strict=True))  # type: ignore[misc]
        for tag, cols in pieces.items()
    }


class RankReader:
    """One msprobe rank dir, read incrementally: a file is parsed again only when it
    changed (msprobe adds a file per window, one per step by default, and appends rows to
    the current window's file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._parsed: dict[Path, tuple[tuple[int, int], Arrays]] = {}

    def poll(self) -> tuple[bool, Arrays] | None:
        """None when nothing changed; else ``(whole, series)``: ``whole`` True with every
        series when a file read before changed or went, False with the new files' series
        only when files were only added."""
        listing = csv_files(self.path)
        files = [f for f, _ in listing]
        new: list[Path] = []
        whole = False
        for file, kind in listing:
            try:
                st = file.stat()
            except OSError:
                continue
            sig = (st.st_size, st.st_mtime_ns)
            before = self._parsed.get(file)
            if before is not None and before[0] == sig:
                continue
            out = Columns()
            read_file(file, kind, out)
            self._parsed[file] = (sig, out.arrays())
            if before is None:
                new.append(file)
            else:
                whole = True
        for gone in set(self._parsed) - set(files):
            del self._parsed[gone]
            whole = True
        if whole:
            return True, _joined([self._parsed[f][1] for f in files if f in self._parsed])
        if new:
            return False, _joined([self._parsed[f][1] for f in new])
        return None


def status(paths: list[Path], now: float) -> str:
    """running when a file was written in the last ``RECENT_SECS``, else finished:
    msprobe leaves neither a marker nor read-only files to say how a run ended."""
    newest = max((p.stat().st_mtime for p in paths if p.exists()), default=None)
    return "running" if newest is not None and now - newest < RECENT_SECS else "finished"
