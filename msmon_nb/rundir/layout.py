"""What a run directory holds, and the one rule for a run's status.

The run-dir layout in one place (docs/ARCHITECTURE.md, "Run layout"): the names of the files a run
dir holds, the ``rank_<k>`` dirs of a distributed run, how summary files are recognised
and ordered, the ``msmon_run.json`` marker (read, atomic write), JSON-lines files
(append, read), whether a writer process is alive, and the status of a run. The loader
(``events.runs``), the fast listing (``events.index``), the cleaner, the monitor and the
viewer all ask here, so they cannot disagree. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

MARKER = "msmon_run.json"
ALERTS = "alerts.jsonl"  # one JSON object per alert, appended by the monitor
SNAPSHOTS = "snapshots.jsonl"  # one JSON object per tensor snapshot (its data is in the events)
# one JSON object per intervention (a command or an alert action that changes training)
INTERVENTIONS = "interventions.jsonl"
CHECKPOINTS = "checkpoints"  # the ``checkpoint`` command's files: step_<n>.ckpt
CHECKPOINT_RE = re.compile(r"^step_(\d+)\.ckpt$")
CONFIG_BACKUP = "config_backup"
# the overview EventWriter keeps while it writes (events.overview): rows, and their index
OVERVIEW_DATA = "msmon_overview.bin"
OVERVIEW_INDEX = "msmon_overview.json"
SUMMARY_RE = re.compile(r"summary\.(\d+)(?:\.(\d+))?")
RANK_DIR_RE = re.compile(r"^rank_(\d+)$")
RECENT_SECS = 60.0  # a run without a live marker is running if it wrote this recently
REMOTE_RECENT_SECS = 600.0  # ... if its marker says running on another host
STATUSES = ("running", "finished", "stopped", "interrupted")


def is_summary_file(name: str) -> bool:
    """True for MindSpore summary file names (``_lineage`` files excluded)."""
    return bool(SUMMARY_RE.search(name)) and not name.endswith("_lineage")


def summary_file_key(path: Path) -> tuple[int, str]:
    """Sort key of a summary file: its creation timestamp, then its name."""
    match = SUMMARY_RE.search(path.name)
    return (int(match.group(1)) if match else 0, path.name)


def summary_file_rank(path: Path) -> int:
    """The rank in a summary file's name (``summary.<secs>.<rank>``), 0 when absent."""
    match = SUMMARY_RE.search(path.name)
    return int(match.group(2)) if match and match.group(2) is not None else 0


def rank_of_dir(name: str) -> int | None:
    """``k`` for a dir named ``rank_<k>``, else None."""
    match = RANK_DIR_RE.match(name)
    return int(match.group(1)) if match else None


def rank_dirs(run_dir: Path) -> dict[int, Path]:
    """rank -> ``rank_<k>/`` dir of the run at ``run_dir``, by rank (links not followed)."""
    out = {}
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return out
    for entry in entries:
        rank = rank_of_dir(entry.name)
        if rank is not None and entry.is_dir(follow_symlinks=False):
            out[rank] = Path(entry.path)
    return dict(sorted(out.items()))


def per_rank_files(run_dir: Path, name: str) -> list[Path]:
    """``run_dir/name`` and ``rank_<k>/name`` of every rank dir, in rank order (existing
    or not: a reader skips the missing ones)."""
    return [run_dir / name, *(sub / name for sub in rank_dirs(run_dir).values())]


def run_files(path: Path) -> list[tuple[Path, int]]:
    """Summary files of the run at ``path`` (its ``rank_<k>/`` dirs included) with ranks."""
    found: list[tuple[Path, int]] = []
    try:
        entries = list(os.scandir(path))
    except OSError:
        return found
    for entry in entries:
        if entry.is_file() and is_summary_file(entry.name):
            found.append((Path(entry.path), summary_file_rank(Path(entry.path))))
        elif entry.is_dir(follow_symlinks=False) and (rank := rank_of_dir(entry.name)) is not None:
            try:
                for sub in os.scandir(entry.path):
                    if sub.is_file() and is_summary_file(sub.name):
                        found.append((Path(sub.path), rank))
            except OSError:
                continue
    return found


def checkpoint_files(run_dir: Path) -> list[dict[str, Any]]:
    """The checkpoints the ``checkpoint`` command wrote into a run (every rank's
    ``checkpoints/step_<n>.ckpt``): ``{rank, step, path, bytes, time}`` by step, then
    rank (rank None for a single-process run)."""
    dirs: list[tuple[int | None, Path]] = [(None, run_dir)]
    dirs += list(rank_dirs(run_dir).items())
    out = []
    for rank, where in dirs:
        try:
            entries = list(os.scandir(where / CHECKPOINTS))
        except OSError:
            continue
        for entry in entries:
            match = CHECKPOINT_RE.match(entry.name)
            if match is None:
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            step = int(match.group(1))
            out.append(
                {
                    "rank": rank,
                    "step": step,
                    "path": entry.path,
                    "bytes": st.st_size,
                    "time": st.st_mtime,
                }
            )
    return sorted(out, key=lambda c: (c["step"], -1 if c["rank"] is None else c["rank"]))


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a marker, summary files, or rank_<k> dirs with them."""
    p = Path(path)
    if (p / MARKER).is_file() or run_files(p):
        return True
    # a distributed job whose ranks have written their markers but no records yet (a dir
    # merely named rank_<k> holding a one-process run stays a run of its own)
    for sub in rank_dirs(p).values():
        marker = read_marker_file(sub / MARKER)
        if marker is not None and int(marker.get("ranks", 0) or 0) > 1:
            return True
    return False


def find_run_dirs(base: str | os.PathLike[str], max_depth: int = 4) -> list[Path]:
    """Run dirs under ``base`` (``base`` itself included), not descending into runs."""
    return walk_runs(base, lambda path: [path] if is_run_dir(path) else None, max_depth)


def walk_runs(
    base: str | os.PathLike[str],
    take: Callable[[Path], list[Path] | None],
    max_depth: int = 4,
) -> list[Path]:
    """The runs ``take`` finds in ``base`` and the dirs under it (links not followed), by
    name: ``take(dir)`` returns the runs that dir is or holds (it is not descended into),
    or None to look inside it, down to ``max_depth``."""
    found: list[Path] = []

    def walk(path: Path, depth: int) -> None:
        runs = take(path)
        if runs is not None:
            found.extend(runs)
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
        except OSError:
            return
        for child in children:
            walk(Path(child), depth + 1)

    walk(Path(base), 0)
    return found


def file_signature(paths: Iterable[Path]) -> tuple:
    """What changes when any of ``paths`` is written (path, size, mtime of each that exists)."""
    sig = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue
        sig.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(sig)


# --- the marker -----------------------------------------------------------------------


def read_marker_file(path: Path) -> dict[str, Any] | None:
    """A marker's content, or None when missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_marker(run_dir: Path) -> dict[str, Any] | None:
    """The marker of ``run_dir``, or None."""
    return read_marker_file(run_dir / MARKER)


def write_marker(run_dir: Path, data: dict[str, Any]) -> None:
    """Atomically replace ``run_dir/msmon_run.json`` with ``data`` (write + rename, so
    readers never see half a file)."""
    tmp = run_dir / f".{MARKER}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        tmp.replace(run_dir / MARKER)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def rank_markers(run_dir: Path) -> dict[int, dict[str, Any]]:
    """rank -> the marker of ``rank_<k>/`` (distributed runs written by us)."""
    out = {}
    for rank, sub in rank_dirs(run_dir).items():
        marker = read_marker_file(sub / MARKER)
        if marker is not None:
            out[rank] = marker
    return out


# --- JSON lines -----------------------------------------------------------------------


def append_jsonl(path: Path, item: dict[str, Any]) -> None:
    """Append one JSON line (written whole, so readers never see half an object)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(item, default=float) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file; a torn last line (still being written) is skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def read_run_jsonl(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """Objects of ``run_dir/name`` and ``run_dir/rank_<k>/name`` (``per_rank_files``)."""
    return [item for path in per_rank_files(run_dir, name) for item in read_jsonl(path)]


# --- liveness and status ----------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def marker_alive(marker: dict | None) -> bool:
    """True when the marker says running and its pid lives on this host."""
    if not marker or marker.get("status") != "running":
        return False
    if marker.get("host") != socket.gethostname() or not marker.get("pid"):
        return False
    try:
        return pid_alive(int(marker["pid"]))
    except (TypeError, ValueError):
        return False


def readonly(path: Path) -> bool:
    """True for a file nobody may write any more (``SummaryRecord`` leaves 0400 files)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (mode & 0o222) or not os.access(path, os.W_OK)


def last_write(files: Iterable[Path]) -> float | None:
    """The newest modification time of ``files``, or None."""
    times = []
    for path in files:
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue
    return max(times) if times else None


def run_status(
    marker: dict | None,
    files: list[Path],
    written: float | None = None,
    now: float | None = None,
) -> str:
    """running, finished, stopped or interrupted: the one rule for a run (or one rank).

    A marker that says how the run ended is believed. A marker that says running is
    checked: its pid on this host, else a write in the last ``REMOTE_RECENT_SECS``. Without
    a marker (MindSpore's own runs): all files read-only means finished, a write in the
    last ``RECENT_SECS`` running, else interrupted. ``written``: the newest write among
    ``files`` when the caller knows it (else it is read from the files).
    """
    if marker and marker.get("status") in ("finished", "stopped", "interrupted"):
        return str(marker["status"])
    if written is None:
        written = last_write(files)
    age = (time.time() if now is None else now) - written if written is not None else None
    if marker and marker.get("status") == "running":
        if marker.get("host") == socket.gethostname() and marker.get("pid"):
            return "running" if marker_alive(marker) else "interrupted"
        return "running" if age is not None and age < REMOTE_RECENT_SECS else "interrupted"
    if files and all(readonly(f) for f in files):
        return "finished"
    return "running" if age is not None and age < RECENT_SECS else "interrupted"


def combined_status(by_rank: Iterable[str]) -> str:
    """A distributed run's status: the most alarming of its ranks'."""
    statuses = set(by_rank)
    return next((s for s in ("running", "interrupted", "stopped") if s in statuses), "finished")
